//! `myriad bench mem`: the memory manager under the local workloads of the DXMem
//! evaluation (Facebook-B/F, YCSB-A, get-only), uniform or zipfian keys, single or batched
//! operations, 1 or 2 threads.
//!
//! Each configuration loads a fresh store with single `create` calls (the load rate), then
//! runs a fixed number of operations and reports wall-clock throughput including the
//! harness (key choice, timing), per-call latency percentiles, metadata per object and the
//! process RSS. Baselines: the Java DXMem figures measured on this machine kind (from the
//! issue that specified this benchmark; an earlier run, not this one, and labelled so in
//! the output) and, in the same run, the machine's dependent random-access latency (a
//! pointer chase over 512 MiB), the floor for a single uniform-random get.
//!
//! # Honest figures (issue 17)
//! - Zipfian ranks are scattered over the objects by a [`Permutation`], a bijection of
//!   `0..objects` (an earlier multiplicative hash shared the factor 5 with 10^6..10^8 and
//!   put every zipfian key on a fifth of the objects). Keys are drawn afresh for every
//!   round of [`KEYS_PER_ROUND`] keys per thread, with the clock stopped while the
//!   threads draw (nothing is replayed).
//! - A failed get or put is counted as a failure, not as a done operation: the line
//!   reports `failed_ops`, and the run fails.
//! - The load rate is reported twice: the median of three loads in this process (on
//!   memory earlier phases had touched) and one load in a fresh child process.
//! - Ratios to DXMem exist only where DXMem has a like-for-like figure: uniform keys,
//!   single operations, the same object size and thread count.

use std::hint::black_box;
use std::process::Command;
use std::sync::Barrier;
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
use crate::tool;

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
    /// Internal: load `--objects` of `--size` bytes from `--threads` threads once, print
    /// the rate as one JSON line and exit (the fresh-process load, run as a child).
    #[arg(long, hide = true)]
    pub fresh_load_child: bool,
}

/// Where the DXMem figures come from, printed beside every ratio to them.
pub const DXMEM_SOURCE: &str =
    "DXMem figure from an earlier run on this machine kind (the issue), not measured in this run";

/// DXMem (Java) on this machine kind, from the issue: (workload, size, threads) → ops/s for
/// uniform single operations. `None` for every other line (zipfian keys, batches): DXMem
/// has no like-for-like figure for them.
fn dxmem_ops_per_sec(
    workload: Workload,
    distribution: KeyDistribution,
    batch: usize,
    size: usize,
    threads: usize,
) -> Option<f64> {
    if distribution != KeyDistribution::Uniform || batch != 1 {
        return None;
    }
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

/// DXMem's load rate on this machine kind: 2.96 M creates/s (1 thread), 2.17 M (2 threads),
/// for the small objects of its table (32 and 64 bytes; `None` for other sizes).
fn dxmem_load_per_sec(size: usize, threads: usize) -> Option<f64> {
    if size != 32 && size != 64 {
        return None;
    }
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

/// Keys each thread draws per round: the threads draw them with the clock stopped, then
/// run the round's calls timed (rand_distr's Zipf costs tens of ns per draw, as much as a
/// get). 8 MiB of keys per thread.
pub const KEYS_PER_ROUND: usize = 1 << 20;

/// Loads per (size, thread count); the median rate is reported.
const LOAD_RUNS: usize = 3;

/// Seed of the permutation that scatters zipfian ranks (the same for all threads: they
/// share one set of hot objects, as YCSB's clients do).
const PERMUTATION_SEED: u64 = 0x5EED_0F21_7100;

/// Rounds of the Feistel network of [`Permutation`].
const FEISTEL_ROUNDS: usize = 4;

/// A pseudo-random bijection of `0..n` without a table: a balanced Feistel network over
/// the smallest even power of two ≥ `n` (at most 4n values), with cycle walking (an image
/// at or above `n` is encrypted again until it falls below `n`, about 2–4 times on
/// average), which keeps it a bijection of `0..n`. YCSB's "scrambled zipfian" and
/// `bench log-cleaner` use a shuffled table for the same purpose; at 10^8 objects that
/// table would be 400 MiB in the RSS this benchmark reports.
#[derive(Debug, Clone, Copy)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    mask: u64,
    keys: [u64; FEISTEL_ROUNDS],
}

/// SplitMix64's finalizer: a cheap, well-mixing 64-bit hash.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Permutation {
    /// The permutation of `0..n` chosen by `seed` (`n` = 0 is treated as 1).
    pub fn new(n: u64, seed: u64) -> Permutation {
        let n = n.max(1);
        // Bits of the largest index (n - 1), at least 1; halves of at most 32 bits.
        let bits = (64 - (n - 1).leading_zeros()).max(1);
        let half_bits = bits.div_ceil(2);
        let mut keys = [0u64; FEISTEL_ROUNDS];
        let mut state = seed;
        for key in &mut keys {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            *key = mix64(state);
        }
        Permutation {
            n,
            half_bits,
            mask: (1u64 << half_bits) - 1,
            keys,
        }
    }

    /// The image of `index` (< n).
    #[inline]
    pub fn apply(&self, index: u64) -> u64 {
        debug_assert!(index < self.n);
        let mut value = index;
        loop {
            value = self.encrypt(value);
            if value < self.n {
                return value;
            }
        }
    }

    /// One pass of the Feistel network over `0..2^(2 half_bits)` (a bijection of it).
    #[inline]
    fn encrypt(&self, value: u64) -> u64 {
        let (mut left, mut right) = (value >> self.half_bits, value & self.mask);
        for key in self.keys {
            let f = mix64(right ^ key) & self.mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half_bits) | right
    }
}

/// Chooses key indexes for one worker thread. Uniform keys are drawn in the timed loop
/// (a few ns each, as before); zipfian ranks are drawn before each round by [`refill`]
/// (with the clock stopped), each scattered by the shared [`Permutation`], and every round
/// draws new ones.
///
/// [`refill`]: KeyChooser::refill
struct KeyChooser {
    rng: SmallRng,
    /// The zipfian distribution over ranks 1..=objects; `None` for uniform keys.
    zipf: Option<Zipf<f64>>,
    permutation: Permutation,
    /// This round's scattered zipfian key indexes.
    drawn: Vec<u64>,
    position: usize,
    objects: u64,
}

impl KeyChooser {
    fn new(
        distribution: KeyDistribution,
        objects: u64,
        permutation: Permutation,
        seed: u64,
    ) -> Result<KeyChooser, String> {
        if objects == 0 {
            return Err("no objects to choose keys from".into());
        }
        let zipf = match distribution {
            KeyDistribution::Uniform => None,
            KeyDistribution::Zipf => {
                Some(Zipf::new(objects, 0.99).map_err(|e| format!("zipf over {objects}: {e}"))?)
            }
        };
        Ok(KeyChooser {
            rng: SmallRng::seed_from_u64(seed),
            zipf,
            permutation,
            drawn: Vec::new(),
            position: 0,
            objects,
        })
    }

    /// Draws the next round's `count` zipfian keys (nothing for uniform keys).
    fn refill(&mut self, count: usize) {
        let Some(zipf) = self.zipf else { return };
        self.drawn.clear();
        for _ in 0..count {
            let rank = (zipf.sample(&mut self.rng) as u64).clamp(1, self.objects) - 1;
            self.drawn.push(self.permutation.apply(rank));
        }
        self.position = 0;
    }

    /// The next key index (zipfian: at most `count` of the last [`refill`](Self::refill)).
    #[inline]
    fn next(&mut self) -> u64 {
        if self.zipf.is_none() {
            return self.rng.gen_range(0..self.objects);
        }
        let key = self.drawn[self.position];
        self.position += 1;
        key
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
    loads: LoadRates,
    measured: Measured,
    metadata_bytes_per_object: f64,
    rss_bytes: u64,
}

/// The two load figures of one (size, thread count).
#[derive(Debug, Clone, Copy)]
struct LoadRates {
    /// Median of [`LOAD_RUNS`] loads in this process (memory earlier phases touched).
    in_process: f64,
    /// One load in a fresh child process.
    fresh_process: f64,
}

/// What [`measure`] measured.
struct Measured {
    /// Operations that succeeded per second of the timed rounds.
    ops_per_sec: f64,
    /// Per-call latency in ns.
    histogram: Histogram<u64>,
    /// Gets and puts that returned an error (not counted in `ops_per_sec`).
    failed_ops: u64,
    /// Operations attempted.
    attempted_ops: u64,
    /// The first failure's error.
    first_error: Option<String>,
}

/// The header of the text table (with its legend) or the JSON baseline line.
fn print_header(json: bool, latency_ns: f64) {
    if json {
        println!(
            "{}",
            json!({"baseline": "pointer_chase_512mib", "dependent_access_ns": latency_ns})
        );
        return;
    }
    println!("machine baseline: dependent random access over 512 MiB = {latency_ns:.0} ns");
    println!(
        "load/s: median of {LOAD_RUNS} loads in this process (memory earlier phases touched); \
         fresh/s: one load in a fresh child process"
    );
    println!(
        "vs DXMem: ratio to a {DXMEM_SOURCE}; uniform single-operation lines only \
         ('-': no like-for-like DXMem figure)"
    );
    println!(
        "{:<11} {:<8} {:>3} {:>5} {:>6} {:>10} {:>10} {:>13} {:>9} {:>9} {:>9} {:>8} {:>10} {:>10}",
        "workload",
        "keys",
        "thr",
        "batch",
        "size",
        "load/s",
        "fresh/s",
        "ops/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "meta B",
        "RSS MiB",
        "vs DXMem"
    );
}

/// Runs the benchmark as configured and prints its results.
pub fn run(args: &MemArgs) -> Result<(), String> {
    if args.fresh_load_child {
        return fresh_load_child(args);
    }
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
    let most_per_round = thread_counts.iter().max().copied().unwrap_or(1) as u64
        * batches.iter().max().copied().unwrap_or(1) as u64;
    if args.ops < most_per_round || args.objects == Some(0) {
        return Err(format!(
            "--ops must be at least threads × batch ({most_per_round}), --objects at least 1"
        ));
    }

    print_header(args.json, pointer_chase_ns());
    // Group runs by object size so one load serves several workloads (per thread count).
    let mut sizes: Vec<usize> = workloads
        .iter()
        .map(|w| args.size.unwrap_or(w.default_size()))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    for &size in &sizes {
        let objects = default_objects(args, size);
        for &threads in &thread_counts {
            let fresh_process = fresh_process_load(objects, size, threads, args.huge_pages)?;
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
            let loads = LoadRates {
                in_process: rates[rates.len() / 2],
                fresh_process,
            };
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
                        let setup = Setup {
                            workload,
                            distribution,
                            threads,
                            batch,
                            size,
                            ops: args.ops,
                        };
                        let measured = measure(&memory, &keys, &setup)?;
                        let result = RunResult {
                            workload,
                            distribution,
                            threads,
                            batch,
                            objects,
                            size,
                            loads,
                            measured,
                            metadata_bytes_per_object,
                            rss_bytes: process::rss_bytes(),
                        };
                        print_result(&result, args.json);
                        check_failures(&result)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Objects to load for `size`-byte objects: `--objects`, else 10 M (1 M from 1000 bytes).
fn default_objects(args: &MemArgs, size: usize) -> u64 {
    args.objects
        .unwrap_or(if size >= 1000 { 1_000_000 } else { 10_000_000 })
}

/// An error if any operation of `result` failed (its line has been printed).
fn check_failures(result: &RunResult) -> Result<(), String> {
    let measured = &result.measured;
    if measured.failed_ops == 0 {
        return Ok(());
    }
    Err(format!(
        "bench mem: {} of {} operations failed ({}, {} keys, {} threads, batch {}); first error: {}",
        measured.failed_ops,
        measured.attempted_ops,
        result.workload.name(),
        distribution_name(result.distribution),
        result.threads,
        result.batch,
        measured.first_error.as_deref().unwrap_or("?")
    ))
}

fn distribution_name(distribution: KeyDistribution) -> &'static str {
    match distribution {
        KeyDistribution::Uniform => "uniform",
        KeyDistribution::Zipf => "zipf",
    }
}

/// `value / base` rounded to two decimals.
fn ratio(value: f64, base: f64) -> f64 {
    (value / base * 100.0).round() / 100.0
}

fn print_result(result: &RunResult, json: bool) {
    let dxmem = dxmem_ops_per_sec(
        result.workload,
        result.distribution,
        result.batch,
        result.size,
        result.threads,
    );
    let dxmem_load = dxmem_load_per_sec(result.size, result.threads);
    let measured = &result.measured;
    let loads = result.loads;
    if json {
        println!(
            "{}",
            json!({
                "workload": result.workload.name(),
                "distribution": distribution_name(result.distribution),
                "threads": result.threads,
                "batch": result.batch,
                "objects": result.objects,
                "object_bytes": result.size,
                "load_ops_per_sec": loads.in_process.round(),
                "load_measured": format!("median of {LOAD_RUNS} loads in this process, on memory earlier phases touched"),
                "fresh_load_ops_per_sec": loads.fresh_process.round(),
                "fresh_load_measured": "one load in a fresh child process",
                "ops_per_sec": measured.ops_per_sec.round(),
                "failed_ops": measured.failed_ops,
                "first_error": measured.first_error,
                "p50_us": measured.histogram.value_at_quantile(0.50) as f64 / 1000.0,
                "p99_us": measured.histogram.value_at_quantile(0.99) as f64 / 1000.0,
                "p999_us": measured.histogram.value_at_quantile(0.999) as f64 / 1000.0,
                "latency_per": if result.batch == 1 { "operation" } else { "batch call" },
                "metadata_bytes_per_object": (result.metadata_bytes_per_object * 1000.0).round() / 1000.0,
                "rss_bytes": result.rss_bytes,
                "dxmem_ops_per_sec": dxmem,
                "ratio_vs_dxmem": dxmem.map(|base| ratio(measured.ops_per_sec, base)),
                "dxmem_load_ops_per_sec": dxmem_load,
                "load_ratio_vs_dxmem": dxmem_load.map(|base| ratio(loads.in_process, base)),
                "fresh_load_ratio_vs_dxmem": dxmem_load.map(|base| ratio(loads.fresh_process, base)),
                "dxmem_source": (dxmem.is_some() || dxmem_load.is_some()).then_some(DXMEM_SOURCE),
            })
        );
        return;
    }
    println!(
        "{:<11} {:<8} {:>3} {:>5} {:>6} {:>9.2}M {:>9.2}M {:>12.2}M {:>9.2} {:>9.2} {:>9.2} {:>8.2} {:>10.0} {:>10}",
        result.workload.name(),
        distribution_name(result.distribution),
        result.threads,
        result.batch,
        result.size,
        loads.in_process / 1e6,
        loads.fresh_process / 1e6,
        measured.ops_per_sec / 1e6,
        measured.histogram.value_at_quantile(0.50) as f64 / 1000.0,
        measured.histogram.value_at_quantile(0.99) as f64 / 1000.0,
        measured.histogram.value_at_quantile(0.999) as f64 / 1000.0,
        result.metadata_bytes_per_object,
        result.rss_bytes as f64 / (1 << 20) as f64,
        dxmem.map_or("-".to_string(), |base| format!(
            "{:.2}x",
            measured.ops_per_sec / base
        )),
    );
    if measured.failed_ops > 0 {
        println!(
            "  FAILED: {} of {} operations; first error: {}",
            measured.failed_ops,
            measured.attempted_ops,
            measured.first_error.as_deref().unwrap_or("?")
        );
    }
}

/// The arguments of the fresh-load child for one (objects, size, threads) load.
fn fresh_load_args(objects: u64, size: usize, threads: usize, huge_pages: bool) -> Vec<String> {
    vec![
        "bench".into(),
        "mem".into(),
        "--fresh-load-child".into(),
        "--objects".into(),
        objects.to_string(),
        "--size".into(),
        size.to_string(),
        "--threads".into(),
        threads.to_string(),
        "--huge-pages".into(),
        huge_pages.to_string(),
    ]
}

/// The rate the fresh-load child printed (its last stdout line).
fn parse_fresh_load(stdout: &[u8]) -> Result<f64, String> {
    let text = String::from_utf8_lossy(stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or("the fresh-load child printed nothing")?;
    serde_json::from_str::<serde_json::Value>(line)
        .ok()
        .and_then(|value| value["fresh_load_ops_per_sec"].as_f64())
        .ok_or_else(|| format!("the fresh-load child printed {line:?}"))
}

/// One load in a fresh process: this binary run again as `bench mem --fresh-load-child`.
fn fresh_process_load(
    objects: u64,
    size: usize,
    threads: usize,
    huge_pages: bool,
) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let output = tool::run(
        "bench mem fresh-load child",
        Command::new(exe).args(fresh_load_args(objects, size, threads, huge_pages)),
    )
    .map_err(|e| e.to_string())?;
    parse_fresh_load(&output.stdout)
}

/// The child half of [`fresh_process_load`]: one load, its rate as one JSON line.
fn fresh_load_child(args: &MemArgs) -> Result<(), String> {
    let size = args.size.ok_or("--fresh-load-child needs --size")?;
    let objects = default_objects(args, size);
    let threads = args.threads.unwrap_or(1).max(1);
    let (memory, rate, _) = load(objects, size, threads, args.huge_pages)?;
    drop(memory);
    println!("{}", json!({ "fresh_load_ops_per_sec": rate }));
    Ok(())
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

/// One measured configuration.
struct Setup {
    workload: Workload,
    distribution: KeyDistribution,
    threads: usize,
    batch: usize,
    size: usize,
    /// Operations of all threads together.
    ops: u64,
}

/// Failed operations of one worker, and the first error.
#[derive(Default)]
struct Failures {
    count: u64,
    first: Option<String>,
}

impl Failures {
    fn record(&mut self, error: &dyn std::fmt::Display) {
        self.count += 1;
        if self.first.is_none() {
            self.first = Some(error.to_string());
        }
    }
}

/// What one worker thread did.
struct WorkerOutcome {
    histogram: Histogram<u64>,
    failures: Failures,
}

/// Runs `setup.ops` operations in rounds of at most [`KEYS_PER_ROUND`] keys per thread.
/// Each round, every thread draws its keys, all start together with the clock, and the
/// clock stops when the last one is done: the throughput is wall clock over the timed
/// rounds, including the harness in the loop (uniform key choice, get/put choice, timing)
/// but not the zipfian draws.
fn measure(memory: &MemoryManager, keys: &KeySpace, setup: &Setup) -> Result<Measured, String> {
    let (threads, batch) = (setup.threads, setup.batch);
    let calls = setup.ops / threads as u64 / batch as u64;
    let calls_per_round = (KEYS_PER_ROUND / batch).max(1) as u64;
    let rounds = calls.div_ceil(calls_per_round);
    let permutation = Permutation::new(keys.total, PERMUTATION_SEED);
    // Fallible preparation happens before the threads meet at the barrier.
    let choosers = (0..threads as u64)
        .map(|worker| {
            KeyChooser::new(
                setup.distribution,
                keys.total,
                permutation,
                0xC0FFEE + worker,
            )
        })
        .collect::<Result<Vec<_>, String>>()?;
    let line = Barrier::new(threads + 1);
    let mut timed = Duration::ZERO;
    let outcomes: Vec<WorkerOutcome> = std::thread::scope(|scope| {
        let workers: Vec<_> = choosers
            .into_iter()
            .enumerate()
            .map(|(worker, chooser)| {
                let line = &line;
                let plan = WorkerPlan {
                    calls,
                    calls_per_round,
                    decide_seed: 7 + worker as u64,
                };
                scope.spawn(move || run_worker(memory, keys, setup, chooser, plan, line))
            })
            .collect();
        for _ in 0..rounds {
            line.wait();
            let started = Instant::now();
            line.wait();
            timed += started.elapsed();
        }
        workers
            .into_iter()
            .map(|worker| worker.join().expect("benchmark thread panicked"))
            .collect()
    });
    let mut merged = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    let mut failures = Failures::default();
    let mut calls_made = 0;
    for outcome in outcomes {
        calls_made += outcome.histogram.len();
        let _ = merged.add(&outcome.histogram);
        failures.count += outcome.failures.count;
        failures.first = failures.first.or(outcome.failures.first);
    }
    let attempted_ops = calls_made * batch as u64;
    Ok(Measured {
        ops_per_sec: (attempted_ops - failures.count) as f64 / timed.as_secs_f64().max(1e-9),
        histogram: merged,
        failed_ops: failures.count,
        attempted_ops,
        first_error: failures.first,
    })
}

/// How many calls a worker makes, in rounds of how many.
#[derive(Clone, Copy)]
struct WorkerPlan {
    calls: u64,
    calls_per_round: u64,
    decide_seed: u64,
}

/// One worker of [`measure`]: per round, draws its keys, waits at `line` for the clock,
/// makes the round's calls and waits at `line` again.
fn run_worker(
    memory: &MemoryManager,
    keys: &KeySpace,
    setup: &Setup,
    mut chooser: KeyChooser,
    plan: WorkerPlan,
    line: &Barrier,
) -> WorkerOutcome {
    let (batch, size) = (setup.batch, setup.size);
    let mut histogram =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    let mut decide = SmallRng::seed_from_u64(plan.decide_seed);
    let value = vec![0xABu8; size];
    let mut buffer = vec![0u8; size];
    let mut cids = vec![ChunkId::from_raw(0); batch];
    let mut items: Vec<(ChunkId, &[u8])> = Vec::with_capacity(batch);
    let mut failures = Failures::default();
    let mut checksum = 0u64;
    let mut remaining = plan.calls;
    while remaining > 0 {
        let round = remaining.min(plan.calls_per_round);
        remaining -= round;
        chooser.refill(round as usize * batch);
        line.wait();
        for _ in 0..round {
            let get = decide.gen_bool(setup.workload.get_ratio());
            for cid in cids.iter_mut() {
                *cid = keys.cid(chooser.next());
            }
            let begin = Instant::now();
            if batch == 1 {
                if get {
                    match memory.get(cids[0], &mut buffer) {
                        Ok(len) => {
                            let last = buffer[..len].last().copied().unwrap_or(0);
                            checksum = checksum.wrapping_add(u64::from(last));
                        }
                        Err(error) => failures.record(&error),
                    }
                } else if let Err(error) = memory.put(cids[0], &value) {
                    failures.record(&error);
                }
            } else if get {
                memory.get_batch_with(&cids, |_, result| match result {
                    Ok(bytes) => {
                        buffer.copy_from_slice(bytes);
                        checksum = checksum.wrapping_add(u64::from(buffer[size - 1]));
                    }
                    Err(error) => failures.record(&error),
                });
            } else {
                items.clear();
                items.extend(cids.iter().map(|&cid| (cid, &value[..])));
                for result in memory.put_batch(&items) {
                    if let Err(error) = result {
                        failures.record(&error);
                    }
                }
            }
            let _ = histogram.record(begin.elapsed().as_nanos() as u64);
        }
        line.wait();
    }
    black_box(checksum);
    WorkerOutcome {
        histogram,
        failures,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// Checks that `Permutation::new(n, seed)` maps `0..n` onto `0..n`, each image once.
    fn assert_bijection(n: u64, seed: u64) {
        let permutation = Permutation::new(n, seed);
        let mut seen = vec![false; n as usize];
        for index in 0..n {
            let image = permutation.apply(index);
            assert!(image < n, "{index} -> {image}, not below {n}");
            assert!(
                !std::mem::replace(&mut seen[image as usize], true),
                "{image} hit twice (n = {n})"
            );
        }
    }

    #[test]
    fn the_permutation_is_a_bijection() {
        for n in [1, 2, 3, 5, 7, 10, 64, 1000, 4097, 1 << 20, 1_000_000] {
            assert_bijection(n, PERMUTATION_SEED);
        }
        assert_bijection(1_000_000, 1);
        assert_bijection(999_983, 2);
    }

    #[test]
    fn scattered_zipf_keys_cover_far_more_than_a_fifth_of_the_objects() {
        // The multiplicative scatter this replaces (rank × 0x9E3779B97F4A7C15 mod N) put
        // every key on a multiple of 5 for N = 10^6: 200,000 objects at most.
        const N: u64 = 1_000_000;
        let permutation = Permutation::new(N, PERMUTATION_SEED);
        let mut chooser =
            KeyChooser::new(KeyDistribution::Zipf, N, permutation, 1).expect("chooser");
        let mut seen = vec![false; N as usize];
        let mut residues = [0u64; 5];
        let mut distinct = 0u64;
        let rounds = 3;
        for _ in 0..rounds {
            chooser.refill(KEYS_PER_ROUND);
            for _ in 0..KEYS_PER_ROUND {
                let key = chooser.next();
                assert!(key < N);
                residues[(key % 5) as usize] += 1;
                if !std::mem::replace(&mut seen[key as usize], true) {
                    distinct += 1;
                }
            }
        }
        // About 460,000 expected for 3 × 2^20 draws of zipf(0.99) over 10^6 ranks.
        assert!(distinct > 3 * N / 10, "{distinct} distinct objects");
        let draws = (rounds * KEYS_PER_ROUND) as u64;
        for count in residues {
            assert!(count > draws / 20, "keys mod 5: {residues:?}");
        }
    }

    #[test]
    fn every_round_draws_new_zipf_keys() {
        let permutation = Permutation::new(1000, PERMUTATION_SEED);
        let mut chooser =
            KeyChooser::new(KeyDistribution::Zipf, 1000, permutation, 9).expect("chooser");
        let round = |chooser: &mut KeyChooser| {
            chooser.refill(200);
            (0..200).map(|_| chooser.next()).collect::<Vec<u64>>()
        };
        let first = round(&mut chooser);
        let second = round(&mut chooser);
        assert_ne!(first, second);
        assert!(KeyChooser::new(KeyDistribution::Zipf, 0, permutation, 1).is_err());
    }

    #[test]
    fn dxmem_ratios_exist_only_for_like_for_like_lines() {
        use KeyDistribution::{Uniform, Zipf};
        assert!(dxmem_ops_per_sec(Workload::FacebookB, Uniform, 1, 32, 1).is_some());
        assert!(dxmem_ops_per_sec(Workload::FacebookB, Zipf, 1, 32, 1).is_none());
        assert!(dxmem_ops_per_sec(Workload::GetOnly, Uniform, 64, 32, 2).is_none());
        assert!(dxmem_ops_per_sec(Workload::YcsbA, Uniform, 1, 1000, 1).is_none());
        assert!(dxmem_ops_per_sec(Workload::FacebookB, Uniform, 1, 32, 4).is_none());
        assert!(dxmem_load_per_sec(32, 2).is_some());
        assert!(dxmem_load_per_sec(1000, 1).is_none());
    }

    #[test]
    fn failed_operations_are_counted_as_failures_not_as_done() {
        let (memory, _, keys) = load(200, 32, 1, false).expect("load");
        // Every other object is gone: gets and puts of them fail.
        for index in (0..keys.total).step_by(2) {
            memory.remove(keys.cid(index)).expect("remove");
        }
        for (workload, batch) in [
            (Workload::GetOnly, 1),
            (Workload::GetOnly, 8),
            (Workload::YcsbA, 1),
            (Workload::YcsbA, 8),
        ] {
            let setup = Setup {
                workload,
                distribution: KeyDistribution::Uniform,
                threads: 2,
                batch,
                size: 32,
                ops: 4_000,
            };
            let measured = measure(&memory, &keys, &setup).expect("measure");
            assert_eq!(measured.attempted_ops, 4_000);
            assert!(
                (1_000..3_000).contains(&measured.failed_ops),
                "{} failed",
                measured.failed_ops
            );
            assert!(measured.first_error.is_some());
            let result = RunResult {
                workload,
                distribution: KeyDistribution::Uniform,
                threads: 2,
                batch,
                objects: 200,
                size: 32,
                loads: LoadRates {
                    in_process: 1.0,
                    fresh_process: 1.0,
                },
                measured,
                metadata_bytes_per_object: 8.0,
                rss_bytes: 0,
            };
            let error = check_failures(&result).expect_err("the run fails");
            assert!(error.contains("of 4000 operations failed"), "{error}");
        }
        // Nothing removed: nothing fails, and the run passes.
        let (memory, _, keys) = load(200, 32, 1, false).expect("load");
        let setup = Setup {
            workload: Workload::YcsbA,
            distribution: KeyDistribution::Zipf,
            threads: 1,
            batch: 4,
            size: 32,
            ops: 2_000,
        };
        let measured = measure(&memory, &keys, &setup).expect("measure");
        assert_eq!((measured.failed_ops, measured.attempted_ops), (0, 2_000));
        assert!(measured.ops_per_sec > 0.0);
    }

    #[derive(clap::Parser)]
    struct TestCli {
        #[command(subcommand)]
        command: TestCommand,
    }

    #[derive(clap::Subcommand)]
    enum TestCommand {
        #[command(subcommand)]
        Bench(TestBench),
    }

    #[derive(clap::Subcommand)]
    enum TestBench {
        Mem(MemArgs),
    }

    #[test]
    fn the_fresh_load_child_parses_its_arguments_and_reports_a_rate() {
        let argv = std::iter::once("myriad".to_string()).chain(fresh_load_args(1234, 64, 2, false));
        let cli = TestCli::try_parse_from(argv).expect("parses");
        let TestCommand::Bench(TestBench::Mem(args)) = cli.command;
        assert!(args.fresh_load_child);
        assert_eq!(
            (args.objects, args.size, args.threads, args.huge_pages),
            (Some(1234), Some(64), Some(2), false)
        );
        assert!(fresh_load_child(&args).is_ok());
        assert_eq!(
            parse_fresh_load(b"noise\n{\"fresh_load_ops_per_sec\":15000000.0}\n\n"),
            Ok(15e6)
        );
        assert!(parse_fresh_load(b"").is_err());
        assert!(parse_fresh_load(b"{}").is_err());
    }
}
