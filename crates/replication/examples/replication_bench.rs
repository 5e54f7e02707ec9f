//! Prints the replication-cost benchmark ([`myriad_replication::bench::run`]) as a table.
//! `cargo run --release -p myriad-replication --example replication_bench [ops] [durable_ops]`

fn main() {
    let mut options = myriad_replication::bench::BenchOptions::default();
    let mut args = std::env::args().skip(1);
    if let Some(ops) = args.next().and_then(|a| a.parse().ok()) {
        options.ops = ops;
    }
    if let Some(ops) = args.next().and_then(|a| a.parse().ok()) {
        options.durable_ops = ops;
    }
    match myriad_replication::bench::run(&options) {
        Ok(rows) => {
            println!("r  durability   ops/s       p50 us    p99 us    drain ms");
            for row in rows {
                println!(
                    "{}  {:<11} {:>10.0} {:>9.1} {:>9.1} {:>9.1}",
                    row.r,
                    format!("{:?}", row.durability),
                    row.ops_per_sec,
                    row.p50_us,
                    row.p99_us,
                    row.drain_ms
                );
            }
        }
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            std::process::exit(1);
        }
    }
}
