//! `myriad bench mem`: the memory manager under the local workloads of the DXMem
//! evaluation (Facebook-B/F, YCSB-A, get-only), uniform or zipfian keys, single or batched
//! operations, 1 or 2 threads.
//!
//! Each configuration loads a fresh store with single `create` calls (the load rate), then
//! runs a fixed number of operations and reports wall-clock throughput including the
//! harness (key choice, timing), per-call latency percentiles, metadata per object and the
//! process RSS. Baselines: the Java DXMem figures measured on this machine kind (from the
//! issue that specified this benchmark) and, in the same run, the machine's dependent
//! random-access latency (a pointer chase over 512 MiB), the floor for a single
//! uniform-random get.

use std::hint::black_box;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use hdrhistogram::Histogram;
use myriad_mem::{MemoryConfig, MemoryManager};
use myriad_types::{ChunkId, NodeId};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde_json::json;

use crate::process;

/// A workload of the DXMem evaluation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// 32-byte objects, 95% get / 5% put.
    FacebookB,
    /// 64-byte objects, 95% get / 5% put.
    FacebookF,
    /// 1000-byte objects, 50% get / 50% put.
    YcsbA,
    /// Gets only (32-byte objects unless `--size`).
    GetOnly,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::FacebookB => "facebook-b",
            Workload::FacebookF => "facebook-f",
            Workload::YcsbA => "ycsb-a",
            Workload::GetOnly => "get-only",
        }
    }

    fn default_size(self) -> usize {
        match self {
            Workload::FacebookB | Workload::GetOnly => 32,
            Workload::FacebookF => 64,
            Workload::YcsbA => 1000,
        }
    }

    fn get_ratio(self) -> f64 {
        match self {
            Workload::FacebookB | Workload::FacebookF => 0.95,
            Workload::YcsbA => 0.5,
            Workload::GetOnly => 1.0,
        }
    }
}

/// How keys are chosen.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum KeyDistribution {
    /// Every object equally likely.
    Uniform,
    /// Zipfian with exponent 0.99 (YCSB's), hot keys scattered over the ID space.
    Zipf,
}

/// Options of `myriad bench mem`. Without `--workload`, `--distribution`, `--threads` or
/// `--batch`, every value of the omitted option is run.
#[derive(clap::Args, Debug, Clone)]
pub struct MemArgs {
    /// Workload to run (default: all).
    #[arg(long, value_enum)]
    pub workload: Option<Workload>,
    /// Objects to load (default 10 M; YCSB-A's 1000-byte objects default to 1 M).
    #[arg(long)]
    pub objects: Option<u64>,
    /// Object size in bytes (default: the workload's).
    #[arg(long)]
    pub size: Option<usize>,
    /// Worker threads (default: 1 and 2).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Key distribution (default: both).
    #[arg(long, value_enum)]
    pub distribution: Option<KeyDistribution>,
    /// CIDs per call; 1 = single operations (default: 1 and 64).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Operations per run (all threads together).
    #[arg(long, default_value_t = 20_000_000)]
    pub ops: u64,
    /// Back the data region with transparent huge pages (`--huge-pages false` to compare).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub huge_pages: bool,
    /// Print one JSON object per result line.
    #[arg(long)]
    pub json: bool,
}

/// DXMem (Java) on this machine kind, from the issue: (workload, size, threads) → ops/s for
/// uniform single operations.
fn dxmem_ops_per_sec(workload: Workload, size: usize, threads: usize) -> Option<f64> {
    let table = [
        (Workload::FacebookB, 32, 1.03e6, 2.17e6),
        (Workload::FacebookF, 64, 1.09e6, 2.29e6),
        (Workload::GetOnly, 32, 1.20e6, 2.28e6),
        (Workload::GetOnly, 64, 1.05e6, 2.05e6),
    ];
    table
        .iter()
        .find(|row| row.0 == workload && row.1 == size)
        .and_then(|row| match threads {
            1 => Some(row.2),
            2 => Some(row.3),
            _ => None,
        })
}

/// DXMem's load rate on this machine kind: 2.96 M creates/s (1 thread), 2.17 M (2 threads).
fn dxmem_load_per_sec(threads: usize) -> Option<f64> {
    match threads {
        1 => Some(2.96e6),
        2 => Some(2.17e6),
        _ => None,
    }
}

/// Maps a dense key index to a CID through the loaded CID ranges.
struct KeySpace {
    /// (first CID, cumulative count before this range)
    ranges: Vec<(u64, u64)>,
    total: u64,
}

impl KeySpace {
    fn new(ranges: &[(ChunkId, ChunkId)]) -> KeySpace {
        let mut total = 0;
        let ranges = ranges
            .iter()
            .map(|&(first, last)| {
                let entry = (first.raw(), total);
                total += last.raw() - first.raw() + 1;
                entry
            })
            .collect();
        KeySpace { ranges, total }
    }

    #[inline]
    fn cid(&self, index: u64) -> ChunkId {
        let position = self.ranges.partition_point(|&(_, before)| before <= index) - 1;
        let (first, before) = self.ranges[position];
        ChunkId::from_raw(first + index - before)
    }
}

/// Zipfian samples drawn ahead of the timed phase (per thread), so the measured time is
/// the store's and not the sampler's (rand_distr's Zipf costs tens of ns per draw).
const ZIPF_TABLE_LEN: usize = 1 << 20;

/// Loads per (size, thread count); the median rate is reported.
const LOAD_RUNS: usize = 3;

struct KeyChooser {
    rng: SmallRng,
    /// Pre-drawn, scattered key indices (zipf); empty for uniform.
    table: Vec<u64>,
    position: usize,
    objects: u64,
}

impl KeyChooser {
    fn new(distribution: KeyDistribution, objects: u64, seed: u64) -> KeyChooser {
        let mut rng = SmallRng::seed_from_u64(seed);
        let table = match distribution {
            KeyDistribution::Uniform => Vec::new(),
            KeyDistribution::Zipf => match Zipf::new(objects, 0.99) {
                Ok(zipf) => (0..ZIPF_TABLE_LEN)
                    .map(|_| {
                        let rank = zipf.sample(&mut rng) as u64 - 1;
                        // Scatter ranks over the key space so hot keys are not neighbours.
                        ((u128::from(rank) * 0x9E37_79B9_7F4A_7C15) % u128::from(objects)) as u64
                    })
                    .collect(),
                Err(_) => Vec::new(),
            },
        };
        KeyChooser {
            rng,
            table,
            position: 0,
            objects,
        }
    }

    #[inline]
    fn next(&mut self) -> u64 {
        if self.table.is_empty() {
            return self.rng.gen_range(0..self.objects);
        }
        self.position = (self.position + 1) % self.table.len();
        self.table[self.position]
    }
}

/// One result line.
struct RunResult {
    workload: Workload,
    distribution: KeyDistribution,
    threads: usize,
    batch: usize,
    objects: u64,
    size: usize,
    load_ops_per_sec: f64,
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    metadata_bytes_per_object: f64,
    rss_bytes: u64,
}

/// Runs the benchmark as configured and prints its results.
pub fn run(args: &MemArgs) -> Result<(), String> {
    let workloads = match args.workload {
        Some(workload) => vec![workload],
        None => vec![
            Workload::FacebookB,
            Workload::FacebookF,
            Workload::GetOnly,
            Workload::YcsbA,
        ],
    };
    let thread_counts = args.threads.map_or(vec![1, 2], |t| vec![t]);
    let distributions = args
        .distribution
        .map_or(vec![KeyDistribution::Uniform, KeyDistribution::Zipf], |d| {
            vec![d]
        });
    let batches = args.batch.map_or(vec![1, 64], |b| vec![b]);
    if thread_counts.contains(&0) || batches.contains(&0) || args.ops == 0 {
        return Err("--threads, --batch and --ops must be at least 1".into());
    }

    let latency_ns = pointer_chase_ns();
    if args.json {
        println!(
            "{}",
            json!({"baseline": "pointer_chase_512mib", "dependent_access_ns": latency_ns})
        );
    } else {
        println!("machine baseline: dependent random access over 512 MiB = {latency_ns:.0} ns");
        println!(
            "{:<11} {:<8} {:>3} {:>5} {:>6} {:>10} {:>13} {:>9} {:>9} {:>9} {:>8} {:>10} {:>10}",
            "workload",
            "keys",
            "thr",
            "batch",
            "size",
            "load/s",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "meta B",
            "RSS MiB",
            "vs DXMem"
        );
    }

    // Group runs by object size so one load serves several workloads (per thread count).
    let mut sizes: Vec<usize> = workloads
        .iter()
        .map(|w| args.size.unwrap_or(w.default_size()))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    for &size in &sizes {
        let objects = args
            .objects
            .unwrap_or(if size >= 1000 { 1_000_000 } else { 10_000_000 });
        for &threads in &thread_counts {
            // Load three times and report the median rate (as the DXMem figures are medians
            // of three runs); the first touch of fresh pages makes single loads noisy.
            let mut rates = Vec::with_capacity(LOAD_RUNS);
            let mut loaded = None;
            for _ in 0..LOAD_RUNS {
                drop(loaded.take());
                let (memory, rate, keys) = load(objects, size, threads, args.huge_pages)?;
                rates.push(rate);
                loaded = Some((memory, keys));
            }
            rates.sort_by(f64::total_cmp);
            let load_ops_per_sec = rates[rates.len() / 2];
            let Some((memory, keys)) = loaded else {
                return Err("no load ran".to_string());
            };
            let stats = memory.stats();
            let metadata_bytes_per_object =
                stats.metadata_bytes as f64 / stats.chunks.max(1) as f64;
            for &workload in workloads
                .iter()
                .filter(|w| args.size.unwrap_or(w.default_size()) == size)
            {
                for &distribution in &distributions {
                    for &batch in &batches {
                        let (ops_per_sec, histogram) = measure(
                            &memory,
                            &keys,
                            workload,
                            distribution,
                            threads,
                            batch,
                            size,
                            args.ops,
                        );
                        let result = RunResult {
                            workload,
                            distribution,
                            threads,
                            batch,
                            objects,
                            size,
                            load_ops_per_sec,
                            ops_per_sec,
                            p50_us: histogram.value_at_quantile(0.50) as f64 / 1000.0,
                            p99_us: histogram.value_at_quantile(0.99) as f64 / 1000.0,
                            p999_us: histogram.value_at_quantile(0.999) as f64 / 1000.0,
                            metadata_bytes_per_object,
                            rss_bytes: process::rss_bytes(),
                        };
                        print_result(&result, args.json);
                    }
                }
            }
        }
    }
    Ok(())
}

fn print_result(result: &RunResult, json: bool) {
    let dxmem = dxmem_ops_per_sec(result.workload, result.size, result.threads);
    let dxmem_load = dxmem_load_per_sec(result.threads);
    let ratio = dxmem.map(|base| result.ops_per_sec / base);
    if json {
        println!(
            "{}",
            json!({
                "workload": result.workload.name(),
                "distribution": match result.distribution { KeyDistribution::Uniform => "uniform", KeyDistribution::Zipf => "zipf" },
                "threads": result.threads,
                "batch": result.batch,
                "objects": result.objects,
                "object_bytes": result.size,
                "load_ops_per_sec": result.load_ops_per_sec.round(),
                "ops_per_sec": result.ops_per_sec.round(),
                "p50_us": result.p50_us,
                "p99_us": result.p99_us,
                "p999_us": result.p999_us,
                "latency_per": if result.batch == 1 { "operation" } else { "batch call" },
                "metadata_bytes_per_object": (result.metadata_bytes_per_object * 1000.0).round() / 1000.0,
                "rss_bytes": result.rss_bytes,
                "dxmem_ops_per_sec": dxmem,
                "ratio_vs_dxmem": ratio.map(|r| (r * 100.0).round() / 100.0),
                "dxmem_load_ops_per_sec": dxmem_load,
                "load_ratio_vs_dxmem": dxmem_load.map(|base| (result.load_ops_per_sec / base * 100.0).round() / 100.0),
            })
        );
    } else {
        println!(
            "{:<11} {:<8} {:>3} {:>5} {:>6} {:>9.2}M {:>12.2}M {:>9.2} {:>9.2} {:>9.2} {:>8.2} {:>10.0} {:>10}",
            result.workload.name(),
            format!("{:?}", result.distribution).to_lowercase(),
            result.threads,
            result.batch,
            result.size,
            result.load_ops_per_sec / 1e6,
            result.ops_per_sec / 1e6,
            result.p50_us,
            result.p99_us,
            result.p999_us,
            result.metadata_bytes_per_object,
            result.rss_bytes as f64 / (1 << 20) as f64,
            ratio.map_or("-".to_string(), |r| format!("{r:.2}x")),
        );
    }
}

/// Loads `objects` chunks of `size` bytes with single creates from `threads` threads.
fn load(
    objects: u64,
    size: usize,
    threads: usize,
    huge_pages: bool,
) -> Result<(MemoryManager, f64, KeySpace), String> {
    let payload_bytes = objects * size as u64;
    let region_bytes = (payload_bytes + payload_bytes / 4 + (256 << 20)).next_multiple_of(1 << 16);
    let memory = MemoryManager::new(MemoryConfig {
        node_id: NodeId(1),
        region_bytes,
        huge_pages,
        ..MemoryConfig::default()
    })
    .map_err(|error| error.to_string())?;
    let started = Instant::now();
    let failure = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads as u64)
            .map(|worker| {
                let memory = &memory;
                scope.spawn(move || {
                    let share =
                        objects / threads as u64 + u64::from(worker < objects % threads as u64);
                    let value = vec![worker as u8 + 1; size];
                    for _ in 0..share {
                        memory
                            .create_with_data(&value)
                            .map_err(|error| error.to_string())?;
                    }
                    Ok::<(), String>(())
                })
            })
            .collect();
        workers
            .into_iter()
            .find_map(|worker| worker.join().ok().and_then(Result::err))
    });
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(failure) = failure {
        return Err(format!("load failed: {failure}"));
    }
    let keys = KeySpace::new(&memory.chunk_ranges(NodeId(1)));
    if keys.total != objects {
        return Err(format!("loaded {} objects, expected {objects}", keys.total));
    }
    Ok((memory, objects as f64 / elapsed, keys))
}

/// Runs `ops` operations of `workload` and returns (ops/s, per-call latency in ns).
#[allow(clippy::too_many_arguments)]
fn measure(
    memory: &MemoryManager,
    keys: &KeySpace,
    workload: Workload,
    distribution: KeyDistribution,
    threads: usize,
    batch: usize,
    size: usize,
    ops: u64,
) -> (f64, Histogram<u64>) {
    // Workers prepare (key tables, buffers), then all start together with the clock.
    let start_line = std::sync::Barrier::new(threads + 1);
    let mut started = Instant::now();
    let histograms: Vec<Histogram<u64>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads as u64)
            .map(|worker| {
                let start_line = &start_line;
                scope.spawn(move || {
                    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
                        .expect("valid bounds");
                    let mut chooser = KeyChooser::new(distribution, keys.total, 0xC0FFEE + worker);
                    let mut decide = SmallRng::seed_from_u64(7 + worker);
                    let calls = ops / threads as u64 / batch as u64;
                    let value = vec![0xABu8; size];
                    let mut buffer = vec![0u8; size];
                    let mut cids = vec![ChunkId::from_raw(0); batch];
                    let mut items: Vec<(ChunkId, &[u8])> = Vec::with_capacity(batch);
                    let mut checksum = 0u64;
                    start_line.wait();
                    for _ in 0..calls {
                        let get = decide.gen_bool(workload.get_ratio());
                        for cid in cids.iter_mut() {
                            *cid = keys.cid(chooser.next());
                        }
                        let begin = Instant::now();
                        if batch == 1 {
                            if get {
                                if let Ok(len) = memory.get(cids[0], &mut buffer) {
                                    checksum = checksum.wrapping_add(u64::from(buffer[len - 1]));
                                }
                            } else {
                                let _ = memory.put(cids[0], &value);
                            }
                        } else if get {
                            memory.get_batch_with(&cids, |_, result| {
                                if let Ok(bytes) = result {
                                    buffer.copy_from_slice(bytes);
                                    checksum = checksum.wrapping_add(u64::from(buffer[size - 1]));
                                }
                            });
                        } else {
                            items.clear();
                            items.extend(cids.iter().map(|&cid| (cid, &value[..])));
                            black_box(memory.put_batch(&items));
                        }
                        let _ = histogram.record(begin.elapsed().as_nanos() as u64);
                    }
                    black_box(checksum);
                    histogram
                })
            })
            .collect();
        start_line.wait();
        started = Instant::now();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("benchmark thread panicked"))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut merged = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    let mut calls = 0;
    for histogram in &histograms {
        calls += histogram.len();
        let _ = merged.add(histogram);
    }
    ((calls * batch as u64) as f64 / elapsed, merged)
}

/// Average latency of a dependent random access: a pointer chase through a random cycle of
/// cache lines over 512 MiB.
fn pointer_chase_ns() -> f64 {
    const LINES: usize = (512 << 20) / 64;
    const STEPS: usize = 4_000_000;
    let mut next = vec![0u32; LINES * 16];
    // Sattolo's algorithm: one random cycle through every line.
    let mut order: Vec<u32> = (0..LINES as u32).collect();
    let mut rng = SmallRng::seed_from_u64(42);
    for i in (1..LINES).rev() {
        let j = rng.gen_range(0..i);
        order.swap(i, j);
    }
    for i in 0..LINES {
        next[order[i] as usize * 16] = order[(i + 1) % LINES];
    }
    drop(order);
    let started = Instant::now();
    let mut line = 0u32;
    for _ in 0..STEPS {
        line = next[line as usize * 16];
    }
    black_box(line);
    let elapsed: Duration = started.elapsed();
    elapsed.as_nanos() as f64 / STEPS as f64
}
