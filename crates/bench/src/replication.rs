//! `myriad bench replication`: what replication costs a put.
//!
//! Runs [`myriad_replication::bench::run`]: one master and R backups in this process over
//! loopback, each backup with a log engine on disk in a temporary directory under
//! `--dir`, single-threaded puts of `--payload-bytes` for R in `--replication` and each
//! durability mode (async, replicated, durable). Prints a table, or one JSON object per
//! row with `--json`: `{r, durability, ops_per_sec, p50_us, p99_us, drain_ms}`.
//! Asserts nothing.

use std::path::PathBuf;

use myriad_replication::bench::{BenchOptions, BenchRow};
use myriad_replication::Durability;
use serde_json::json;

/// Command-line arguments of `myriad bench replication`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplicationArgs {
    /// Replication factors to measure.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,3")]
    pub replication: Vec<usize>,
    /// Timed puts per configuration in async and replicated mode.
    #[arg(long, default_value_t = 20_000)]
    pub ops: usize,
    /// Timed puts per configuration in durable mode (one sync each).
    #[arg(long, default_value_t = 2_000)]
    pub durable_ops: usize,
    /// Distinct chunks written round robin.
    #[arg(long, default_value_t = 1_000)]
    pub chunks: usize,
    /// Payload bytes per put.
    #[arg(long, default_value_t = 64)]
    pub payload_bytes: usize,
    /// Directory for the backups' logs (default: the system's temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print one JSON object per row.
    #[arg(long)]
    pub json: bool,
}

/// The spelling of a durability mode in the output.
pub fn durability_name(durability: Durability) -> &'static str {
    match durability {
        Durability::Async => "async",
        Durability::Replicated => "replicated",
        Durability::Durable => "durable",
    }
}

/// One row as JSON.
pub fn row_json(row: &BenchRow) -> serde_json::Value {
    json!({
        "r": row.r,
        "durability": durability_name(row.durability),
        "ops_per_sec": row.ops_per_sec,
        "p50_us": row.p50_us,
        "p99_us": row.p99_us,
        "drain_ms": row.drain_ms,
    })
}

/// Runs the benchmark and prints its rows.
pub fn run(args: &ReplicationArgs) -> Result<(), String> {
    let options = BenchOptions {
        ops: args.ops,
        durable_ops: args.durable_ops,
        chunks: args.chunks,
        payload_bytes: args.payload_bytes,
        replication: args.replication.clone(),
        dir: args.dir.clone(),
    };
    let rows = myriad_replication::bench::run(&options).map_err(|e| e.to_string())?;
    if args.json {
        for row in &rows {
            println!("{}", row_json(row));
        }
        return Ok(());
    }
    println!(
        "{:>2} {:<11} {:>12} {:>10} {:>10} {:>10}",
        "R", "durability", "puts/s", "p50 µs", "p99 µs", "drain ms"
    );
    for row in &rows {
        println!(
            "{:>2} {:<11} {:>12.0} {:>10.1} {:>10.1} {:>10.1}",
            row.r,
            durability_name(row.durability),
            row.ops_per_sec,
            row.p50_us,
            row.p99_us,
            row.drain_ms
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_run_prints_rows() {
        let options = BenchOptions {
            ops: 20,
            durable_ops: 5,
            chunks: 4,
            payload_bytes: 16,
            replication: vec![0, 1],
            dir: None,
        };
        let rows = myriad_replication::bench::run(&options).unwrap();
        assert_eq!(rows.len(), 6);
        let value = row_json(&rows[5]);
        assert_eq!(value["r"], 1);
        assert_eq!(value["durability"], "durable");
        assert!(value["ops_per_sec"].as_f64().unwrap() > 0.0);
    }
}
