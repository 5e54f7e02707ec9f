//! The `myriad` command line: one binary with a subcommand per role, tool and benchmark.

use clap::{Parser, Subcommand};

mod demo;
mod superpeer_cmd;

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
    /// Run one member of the superpeer group (metadata, membership, failure detection).
    Superpeer(superpeer_cmd::SuperpeerArgs),
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
    /// The backup-side log engine: append rate, recovery read, disk baseline.
    Log(myriad_bench::log::LogArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo => demo::run(),
        Command::Superpeer(args) => superpeer_cmd::run(&args),
        Command::Bench(BenchCommand::Mem(args)) => {
            myriad_bench::mem::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Net(args)) => {
            myriad_bench::net::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::NetServer(args)) => {
            myriad_bench::net::serve(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(BenchCommand::Log(args)) => {
            myriad_bench::log::run(&args).map_err(anyhow::Error::msg)
        }
    }
}
