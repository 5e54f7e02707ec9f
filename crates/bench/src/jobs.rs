//! `myriad bench jobs`: the compute platform's throughput and superstep latency.
//!
//! # What it measures
//! - **local**: empty jobs submitted from outside to one job service's pool of `workers`
//!   threads (each with its handle waited for), jobs per second; next to it, **Rayon**'s own
//!   pool of as many threads running as many empty `spawn`s in the same run: the bound
//!   for a local pool on this machine.
//! - **steals**: one job fans `jobs` children out onto its own worker's deque; the other
//!   workers steal them (the count printed).
//! - **remote**: a client keeps `window` empty jobs in flight to the peers of a local
//!   cluster (round robin), jobs per second per cluster and per peer.
//! - **delegated**: the same, each job sent to the owner of one of `chunks` chunks per
//!   peer ([`myriad_compute::Jobs::submit_to_owner`]).
//! - **superstep**: a group of all peers but one (the master) runs `builtin.barrier` with
//!   `rounds` rounds: the median barrier round in µs on each slave, and their median
//!   (`superstep_p50_us`); and the median of `tasks` whole one-task submissions.
//!
//! The last line with `--json` is the summary: `local_jobs_per_sec`,
//! `rayon_jobs_per_sec`, `remote_jobs_per_sec`, `delegated_jobs_per_sec`,
//! `superstep_p50_us`, `task_p50_us`, `steals`. Nothing is asserted.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::client::Client;
use myriad_compute::builtin::EmptyJob;
use myriad_compute::client::{group_status, set_role, submit};
use myriad_compute::wire::ScriptEnd;
use myriad_compute::{
    read_int, ComputeConfig, ComputeService, Job, JobContext, JobHandle, Jobs, Registry, Role,
    TaskScript, Wire,
};
use myriad_launcher::LocalCluster;
use myriad_types::codec::{DecodeError, Decoder, Encoder};
use myriad_types::{ChunkId, NodeId};
use serde_json::json;

use crate::report::emit;

/// Options of `myriad bench jobs`.
#[derive(clap::Args, Debug, Clone)]
pub struct JobsArgs {
    /// Peers of the local cluster (one is the group's master, the others slaves).
    #[arg(long, default_value_t = 3)]
    pub peers: usize,
    /// Worker threads of each job pool (and of the Rayon baseline).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Empty jobs per local measurement.
    #[arg(long, default_value_t = 200_000)]
    pub jobs: u64,
    /// Empty jobs per remote and delegated measurement.
    #[arg(long, default_value_t = 20_000)]
    pub remote_jobs: u64,
    /// Remote jobs kept in flight.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// Chunks per peer the delegated jobs are sent for.
    #[arg(long, default_value_t = 100)]
    pub chunks: usize,
    /// Barrier rounds of the superstep measurement.
    #[arg(long, default_value_t = 500)]
    pub rounds: u32,
    /// One-task submissions measured.
    #[arg(long, default_value_t = 50)]
    pub tasks: usize,
    /// Memory of each peer in MiB.
    #[arg(long, default_value_t = 64)]
    pub peer_memory_mb: u64,
    /// Directory of the cluster (default: a fresh one under the temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Only the local measurements (no cluster).
    #[arg(long)]
    pub local_only: bool,
    /// Print one JSON object per line.
    #[arg(long)]
    pub json: bool,
}

/// A job that spawns `n` empty children on its own worker (the steal measurement).
struct FanOut(u64);

impl Wire for FanOut {
    fn put(&self, out: &mut Encoder) {
        out.put_u64_le(self.0);
    }
    fn get(input: &mut Decoder) -> Result<Self, DecodeError> {
        Ok(FanOut(input.get_u64_le("children")?))
    }
}

impl Job for FanOut {
    const NAME: &'static str = "bench.fan-out";
    type Output = ();
    fn run(self, ctx: &JobContext) -> Result<(), String> {
        let mut children: Vec<JobHandle<()>> = (0..self.0).map(|_| ctx.spawn(EmptyJob)).collect();
        for child in &mut children {
            // Helping is not implemented: a waiting worker blocks, so wait only after
            // every child is queued (the other workers steal them meanwhile).
            child
                .wait(Duration::from_secs(60))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

fn per_sec(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Empty jobs through one job service; `(jobs/s, steals of the fan-out run)`.
fn local(args: &JobsArgs) -> Result<(f64, u64), String> {
    let config = ComputeConfig {
        workers: args.workers,
        ..ComputeConfig::default()
    };
    let service = ComputeService::new(config, Registry::with_builtins().job::<FanOut>())
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut handles: VecDeque<JobHandle<()>> = VecDeque::new();
    for _ in 0..args.jobs {
        handles.push_back(service.submit(EmptyJob));
        if handles.len() >= 4096 {
            wait_front(&mut handles)?;
        }
    }
    while !handles.is_empty() {
        wait_front(&mut handles)?;
    }
    let rate = per_sec(args.jobs, started.elapsed());
    let before = service.pool_stats().steals;
    service
        .submit(FanOut(args.jobs.min(50_000)))
        .wait(Duration::from_secs(120))
        .map_err(|e| e.to_string())?;
    let steals = service.pool_stats().steals - before;
    service.shutdown();
    Ok((rate, steals))
}

fn wait_front<T: Wire>(handles: &mut VecDeque<JobHandle<T>>) -> Result<(), String> {
    if let Some(mut handle) = handles.pop_front() {
        handle
            .wait(Duration::from_secs(60))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Rayon's pool of `workers` threads running `jobs` empty spawns.
fn rayon_bound(args: &JobsArgs) -> Result<f64, String> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.workers.max(1))
        .build()
        .map_err(|e| e.to_string())?;
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    for _ in 0..args.jobs {
        let done = Arc::clone(&done);
        pool.spawn(move || {
            done.fetch_add(1, Ordering::Release);
        });
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while done.load(Ordering::Acquire) < args.jobs {
        if Instant::now() > deadline {
            return Err("rayon did not finish".into());
        }
        std::thread::yield_now();
    }
    Ok(per_sec(args.jobs, started.elapsed()))
}

/// Starts the cluster with a compute group (peer 0 master, the rest slaves).
fn start_cluster(
    args: &JobsArgs,
    dir: &std::path::Path,
) -> Result<(LocalCluster, Vec<NodeId>), String> {
    let config = format!(
        "[backup]\nreplication = 0\n[compute]\nworkers = {}\ngroup = 1\nrole = \"slave\"\n",
        args.workers
    );
    crate::cluster::start_local(
        dir,
        "jobs-bench.toml",
        &config,
        args.peers.max(2),
        args.peer_memory_mb,
    )
}

/// Keeps `window` jobs in flight; jobs per second.
fn pipelined(
    count: u64,
    window: usize,
    mut next: impl FnMut(u64) -> JobHandle<()>,
) -> Result<f64, String> {
    let started = Instant::now();
    let mut handles = VecDeque::with_capacity(window);
    for index in 0..count {
        handles.push_back(next(index));
        if handles.len() >= window {
            wait_front(&mut handles)?;
        }
    }
    while !handles.is_empty() {
        wait_front(&mut handles)?;
    }
    Ok(per_sec(count, started.elapsed()))
}

/// The cluster figures: remote, delegated, superstep and task medians.
fn cluster_figures(args: &JobsArgs, client: &Client, peers: &[NodeId]) -> Result<[f64; 4], String> {
    let jobs = Jobs::new(client.clone());
    // Warm-up: connections to every peer, the peers' pools awake.
    pipelined(2_000, args.window, |i| {
        jobs.submit_to(peers[i as usize % peers.len()], EmptyJob)
    })?;
    let remote = pipelined(args.remote_jobs, args.window, |i| {
        jobs.submit_to(peers[i as usize % peers.len()], EmptyJob)
    })?;
    let mut cids: Vec<ChunkId> = Vec::new();
    for peer in peers {
        let payloads = vec![Bytes::from_static(&[0u8; 8]); args.chunks.max(1)];
        let created = client.blocking().chunks().create_with_data(*peer, payloads);
        cids.extend(created.map_err(|e| e.to_string())?);
    }
    let delegated = pipelined(args.remote_jobs, args.window, |i| {
        let cid = cids[i as usize % cids.len()];
        jobs.submit_to_owner(cid, EmptyJob)
    })?;
    set_role(client, peers[0], 1, Role::Master).map_err(|e| e.to_string())?;
    let want = peers.len() - 1;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !group_status(client, 1).is_ok_and(|status| status.slaves.len() == want) {
        if Instant::now() > deadline {
            return Err(format!("the group did not get its {want} slaves"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let barrier = TaskScript::single(
        "builtin.barrier",
        Bytes::from(format!("{{\"rounds\":{}}}", args.rounds)),
        want as u32,
        0,
    );
    let mut barrier = barrier;
    barrier.group = 1;
    let reply = submit(client, &barrier, Duration::from_secs(120)).map_err(|e| e.to_string())?;
    if reply.end != ScriptEnd::Finished {
        return Err(format!("barrier task: {:?}", reply.end));
    }
    let mut per_slave: Vec<f64> = reply.tasks[0]
        .values
        .iter()
        .filter_map(|value| read_int(value).map(|us| us as f64))
        .collect();
    let superstep = median(&mut per_slave);
    let mut task_micros = Vec::with_capacity(args.tasks);
    for _ in 0..args.tasks.max(1) {
        let mut one = TaskScript::single(
            "builtin.value",
            Bytes::from_static(b"{\"value\":1}"),
            want as u32,
            0,
        );
        one.group = 1;
        let reply = submit(client, &one, Duration::from_secs(60)).map_err(|e| e.to_string())?;
        task_micros.push(reply.tasks.first().map_or(0.0, |task| task.micros as f64));
    }
    Ok([remote, delegated, superstep, median(&mut task_micros)])
}

/// Runs the benchmark (see the module documentation).
pub fn run(args: &JobsArgs) -> Result<(), String> {
    let (local_rate, steals) = local(args)?;
    let rayon_rate = rayon_bound(args)?;
    emit(
        args.json,
        json!({"bench": "jobs", "case": "local", "workers": args.workers, "jobs": args.jobs,
               "jobs_per_sec": local_rate, "rayon_jobs_per_sec": rayon_rate,
               "ratio_to_rayon": local_rate / rayon_rate.max(1e-9), "steals": steals}),
        format!(
            "local   {:>12.0} jobs/s ({} workers; Rayon {:.0} jobs/s, ratio {:.2}); fan-out of {} children: {} stolen",
            local_rate,
            args.workers,
            rayon_rate,
            local_rate / rayon_rate.max(1e-9),
            args.jobs.min(50_000),
            steals
        ),
    );
    let mut summary = json!({
        "bench": "jobs", "case": "summary", "workers": args.workers,
        "local_jobs_per_sec": local_rate, "rayon_jobs_per_sec": rayon_rate, "steals": steals,
    });
    if !args.local_only {
        let temporary = tempfile::tempdir().map_err(|e| e.to_string())?;
        let dir = args
            .dir
            .clone()
            .unwrap_or_else(|| temporary.path().to_path_buf());
        let (cluster, peers) = start_cluster(args, &dir)?;
        let secret = cluster.secret().map_err(|e| e.to_string())?;
        let client = Client::connect(cluster.superpeers(), secret).map_err(|e| e.to_string())?;
        let figures = cluster_figures(args, &client, &peers);
        client.shutdown();
        drop(cluster);
        let [remote, delegated, superstep, task] = figures?;
        let n = peers.len() as f64;
        emit(
            args.json,
            json!({"bench": "jobs", "case": "cluster", "peers": peers.len(), "window": args.window,
                   "remote_jobs_per_sec": remote, "remote_jobs_per_sec_per_peer": remote / n,
                   "delegated_jobs_per_sec": delegated, "delegated_jobs_per_sec_per_peer": delegated / n,
                   "slaves": peers.len() - 1, "superstep_p50_us": superstep, "task_p50_us": task}),
            format!(
                "cluster {} peers: remote {:.0} jobs/s ({:.0}/peer), delegated {:.0} jobs/s ({:.0}/peer); \
                 {} slaves: barrier round p50 {:.0} us, one-task submission p50 {:.0} us",
                peers.len(), remote, remote / n, delegated, delegated / n, peers.len() - 1, superstep, task
            ),
        );
        summary["peers"] = json!(peers.len());
        summary["remote_jobs_per_sec"] = json!(remote);
        summary["delegated_jobs_per_sec"] = json!(delegated);
        summary["superstep_p50_us"] = json!(superstep);
        summary["task_p50_us"] = json!(task);
    }
    if args.json {
        println!("{summary}");
    }
    Ok(())
}
