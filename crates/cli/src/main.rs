//! The `myriad` command line: one binary with a subcommand per role, tool and benchmark.

use clap::{Parser, Subcommand};

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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo => {
            println!("myriad demo");
            Ok(())
        }
    }
}
