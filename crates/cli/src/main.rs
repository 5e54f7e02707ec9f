//! The `myriad` command line: one binary with a subcommand per role, tool and benchmark.

use clap::{Parser, Subcommand};

mod cluster;
mod demo;
mod term;

/// Myriad: a distributed in-memory key-value store for billions of small objects.
#[derive(Parser, Debug)]
#[command(name = "myriad", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the demo of what Myriad can do today.
    Demo,
    /// Start, inspect, stop and drill a local cluster.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// The terminal: DXTerm's commands, interactive or one-shot (-c).
    Term(term::TermArgs),
    /// Benchmarks that print their figures.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// The memory manager under the DXMem workloads.
    Mem(myriad_bench::mem::MemArgs),
    /// The messaging layer between two processes on 127.0.0.1.
    Net(myriad_bench::net::NetArgs),
    /// The server half of `bench net` (started by it).
    #[command(hide = true)]
    NetServer(myriad_bench::net::NetServerArgs),
    /// Small-object get/put of a local cluster, with Redis and memcached baselines.
    Kv(myriad_bench::kv::KvArgs),
    /// The backup-side log engine: append rate, recovery read, disk baseline.
    Log(myriad_bench::log::LogArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo => demo::run(),
        Command::Cluster(command) => cluster::run(command),
        Command::Term(args) => term::main(args),
        Command::Bench(BenchCommand::Mem(args)) => {
            myriad_bench::mem::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Net(args)) => {
            myriad_bench::net::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::NetServer(args)) => {
            myriad_bench::net::serve(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Kv(args)) => {
            myriad_bench::kv::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Log(args)) => {
            myriad_bench::log::run(&args).map_err(anyhow::Error::msg)
        }
    }
}
