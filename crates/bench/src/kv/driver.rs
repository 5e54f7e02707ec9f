//! A closed-loop load driver: N threads, each with its own worker, calling it back to back
//! over uniform random keys for a warm-up and then a fixed duration.
//!
//! # What is measured
//! - Each call of a worker is one operation or one batch of `batch` operations over the
//!   key indexes it is given; its latency (per call, not per operation) goes into an HDR
//!   histogram (1 µs .. 60 s, 3 significant digits).
//! - Throughput counts operations (calls × batch) completed in the measured window.
//!
//! # Invariants
//! - Every thread stops by `warmup + duration` plus one call; a failing worker stops all
//!   threads and the run returns its error (the first one).
//! - Keys are uniform over `0..key_count` from a per-thread seeded RNG (reproducible
//!   sequence per seed, not a reproducible interleaving).
//!
//! Called by the `bench kv` targets (Myriad, memcached).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// One thread's worker: performs one operation (or one batch) over the given key indexes.
pub type WorkerFn = Box<dyn FnMut(&[u64]) -> Result<(), String> + Send>;

/// Largest latency recorded (longer calls are clamped to it).
const LATENCY_MAX_US: u64 = 60_000_000;
/// Largest batch a call may carry.
pub const BATCH_MAX: usize = 4096;

/// How to drive the workers.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// Key indexes handed to workers are uniform over `0..key_count`.
    pub key_count: u64,
    /// Keys per call (1 = single operations).
    pub batch: usize,
    /// Time run before measuring.
    pub warmup: Duration,
    /// Time measured.
    pub duration: Duration,
    /// Seed of the key choice (thread `i` uses `seed + i`).
    pub seed: u64,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct DriverResult {
    /// Operations completed in the measured window (calls × batch).
    pub ops: u64,
    /// Calls completed in the measured window.
    pub calls: u64,
    /// Length of the measured window.
    pub elapsed: Duration,
    /// Latency of one call, µs, percentiles 50 and 99 and 99.9.
    pub p50_us: f64,
    /// 99th percentile of the call latency, µs.
    pub p99_us: f64,
    /// 99.9th percentile of the call latency, µs.
    pub p999_us: f64,
    /// Mean call latency, µs.
    pub mean_us: f64,
}

impl DriverResult {
    /// Operations per second over the measured window.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Runs every worker on its own thread (one thread per worker) and merges the results.
pub fn run_closed_loop(
    config: &DriverConfig,
    workers: Vec<WorkerFn>,
) -> Result<DriverResult, String> {
    if workers.is_empty() {
        return Err("no workers".into());
    }
    if config.key_count == 0 {
        return Err("key_count is zero".into());
    }
    if config.batch == 0 || config.batch > BATCH_MAX {
        return Err(format!("batch must be 1..={BATCH_MAX}"));
    }
    let threads = workers.len();
    let start_line = Arc::new(Barrier::new(threads + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::with_capacity(threads);
    for (index, mut worker) in workers.into_iter().enumerate() {
        let start_line = start_line.clone();
        let stop = stop.clone();
        let config = config.clone();
        let handle = std::thread::Builder::new()
            .name(format!("kv-driver-{index}"))
            .spawn(move || -> Result<(Histogram<u64>, u64), String> {
                let mut histogram = latency_histogram()?;
                let mut rng = SmallRng::seed_from_u64(config.seed.wrapping_add(index as u64));
                let mut keys = vec![0u64; config.batch];
                start_line.wait();
                let begin = Instant::now();
                let measure_from = begin + config.warmup;
                let end = measure_from + config.duration;
                let mut calls = 0u64;
                loop {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    for key in keys.iter_mut() {
                        *key = rng.gen_range(0..config.key_count);
                    }
                    let called = Instant::now();
                    if called >= end {
                        break;
                    }
                    if let Err(error) = worker(&keys) {
                        stop.store(true, Ordering::Relaxed);
                        return Err(error);
                    }
                    if called >= measure_from {
                        record_latency(&mut histogram, called.elapsed());
                        calls += 1;
                    }
                }
                Ok((histogram, calls))
            })
            .map_err(|e| format!("spawning a driver thread: {e}"))?;
        handles.push(handle);
    }
    start_line.wait();
    let mut merged = latency_histogram()?;
    let mut calls = 0u64;
    let mut first_error = None;
    for handle in handles {
        match handle.join() {
            Ok(Ok((histogram, thread_calls))) => {
                merged.add(&histogram).map_err(|e| e.to_string())?;
                calls += thread_calls;
            }
            Ok(Err(error)) => {
                first_error.get_or_insert(error);
            }
            Err(_) => {
                first_error.get_or_insert_with(|| "a driver thread panicked".to_string());
            }
        }
    }
    if let Some(error) = first_error {
        return Err(error);
    }
    Ok(DriverResult::from_histogram(&merged, calls, config))
}

/// A fresh latency histogram of the driver's bounds (1 µs .. 60 s, 3 digits).
pub fn latency_histogram() -> Result<Histogram<u64>, String> {
    Histogram::<u64>::new_with_bounds(1, LATENCY_MAX_US, 3).map_err(|e| e.to_string())
}

/// Records one call's latency, clamped to the histogram's bounds.
pub fn record_latency(histogram: &mut Histogram<u64>, latency: Duration) {
    let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    histogram.saturating_record(micros.clamp(1, LATENCY_MAX_US));
}

impl DriverResult {
    /// The result of `calls` calls of `config.batch` operations each, measured over
    /// `config.duration`, with their merged latency histogram.
    pub fn from_histogram(merged: &Histogram<u64>, calls: u64, config: &DriverConfig) -> Self {
        DriverResult {
            ops: calls * config.batch as u64,
            calls,
            elapsed: config.duration,
            p50_us: merged.value_at_quantile(0.50) as f64,
            p99_us: merged.value_at_quantile(0.99) as f64,
            p999_us: merged.value_at_quantile(0.999) as f64,
            mean_us: merged.mean(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn counts_operations_as_calls_times_batch_and_keys_stay_in_range() {
        let seen_max = Arc::new(AtomicU64::new(0));
        let workers: Vec<WorkerFn> = (0..2)
            .map(|_| {
                let seen_max = seen_max.clone();
                Box::new(move |keys: &[u64]| {
                    assert_eq!(keys.len(), 4);
                    for &key in keys {
                        seen_max.fetch_max(key, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_micros(200));
                    Ok(())
                }) as WorkerFn
            })
            .collect();
        let config = DriverConfig {
            key_count: 10,
            batch: 4,
            warmup: Duration::from_millis(20),
            duration: Duration::from_millis(200),
            seed: 1,
        };
        let result = run_closed_loop(&config, workers).expect("run");
        assert!(result.calls > 10, "{result:?}");
        assert_eq!(result.ops, result.calls * 4);
        assert!(seen_max.load(Ordering::Relaxed) < 10);
        assert!(result.p50_us >= 200.0, "{result:?}");
    }

    #[test]
    fn a_failing_worker_fails_the_run() {
        let workers: Vec<WorkerFn> = vec![
            Box::new(|_: &[u64]| Err("boom".to_string())),
            Box::new(|_: &[u64]| Ok(())),
        ];
        let config = DriverConfig {
            key_count: 10,
            batch: 1,
            warmup: Duration::ZERO,
            duration: Duration::from_secs(5),
            seed: 1,
        };
        let started = Instant::now();
        assert_eq!(
            run_closed_loop(&config, workers).map(|_| ()),
            Err("boom".into())
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
