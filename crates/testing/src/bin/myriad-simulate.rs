//! `myriad-simulate`: runs the deterministic cluster simulation over many seeds.
//!
//! Job: `myriad-simulate --seeds N [--first F] [--seed S] [--bug no-freeze|ids-before-ranges|keep-diverged]
//! [--durability async|replicated|durable] [--no-migrations] [--trace]` runs seeds `F..F+N` (or the one
//! seed `S`, printing its whole trace with `--trace`), prints a summary line per 100 seeds
//! and, for the first failing seed, its failure, the command that replays it and the last
//! events of its trace (all of them for `--seed S --trace`). Exit status 1 when a seed
//! failed, 2 on bad arguments.
//!
//! Invariants: every run is deterministic (see `myriad_testing::sim`): the printed
//! command replays the failure exactly.
//!
//! Callers: `scripts/simulate`, CI, developers.

use std::process::ExitCode;
use std::time::Instant;

use myriad_testing::sim::{self, Bug, SimConfig, SimDurability, SimRun};

/// Trace lines printed for a failure (without `--trace`).
const TRACE_TAIL: usize = 80;

struct Args {
    first: u64,
    seeds: u64,
    trace: bool,
    config: SimConfig,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        first: 0,
        seeds: 100,
        trace: false,
        config: SimConfig::default(),
    };
    let mut it = std::env::args().skip(1);
    let number = |value: Option<String>, what: &str| -> Result<u64, String> {
        value
            .ok_or(format!("{what} needs a value"))?
            .parse()
            .map_err(|e| format!("{what}: {e}"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--seeds" => args.seeds = number(it.next(), "--seeds")?,
            "--first" => args.first = number(it.next(), "--first")?,
            "--seed" => {
                args.first = number(it.next(), "--seed")?;
                args.seeds = 1;
            }
            "--trace" => args.trace = true,
            "--migrations" => args.config.migrations = true,
            "--no-migrations" => args.config.migrations = false,
            "--no-raft" => args.config.raft = false,
            "--bug" => {
                args.config.bug = Some(match it.next().as_deref() {
                    Some("no-freeze") => Bug::NoRecoveryFreeze,
                    Some("ids-before-ranges") => Bug::IdsBeforeRanges,
                    Some("keep-diverged") => Bug::KeepDivergedSurvivors,
                    Some("take-orphans") => Bug::TakeOverOrphans,
                    other => return Err(format!("unknown bug {other:?}")),
                })
            }
            "--durability" => {
                args.config.durability = Some(match it.next().as_deref() {
                    Some("async") => SimDurability::Async,
                    Some("replicated") => SimDurability::Replicated,
                    Some("durable") => SimDurability::Durable,
                    other => return Err(format!("unknown durability {other:?}")),
                })
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn replay_command(run: &SimRun, config: &SimConfig) -> String {
    let bug = match config.bug {
        Some(Bug::NoRecoveryFreeze) => " --bug no-freeze",
        Some(Bug::IdsBeforeRanges) => " --bug ids-before-ranges",
        Some(Bug::KeepDivergedSurvivors) => " --bug keep-diverged",
        Some(Bug::TakeOverOrphans) => " --bug take-orphans",
        None => "",
    };
    let durability = match config.durability {
        Some(SimDurability::Async) => " --durability async",
        Some(SimDurability::Replicated) => " --durability replicated",
        Some(SimDurability::Durable) => " --durability durable",
        None => "",
    };
    let migrations = if config.migrations {
        ""
    } else {
        " --no-migrations"
    };
    let raft = if config.raft { "" } else { " --no-raft" };
    format!(
        "scripts/simulate --seed {}{bug}{durability}{migrations}{raft} --trace",
        run.seed
    )
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("myriad-simulate: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let mut crashes = 0;
    for seed in args.first..args.first.saturating_add(args.seeds) {
        let run = sim::run(seed, &args.config);
        crashes += run.stats.crashes;
        if args.trace {
            for line in &run.trace {
                println!("{line}");
            }
        }
        if let Some(failure) = &run.failure {
            println!("FAILED seed {seed} ({:?}): {failure}", run.scenario);
            if !args.trace {
                let skip = run.trace.len().saturating_sub(TRACE_TAIL);
                println!("last {} events:", run.trace.len() - skip);
                for line in &run.trace[skip..] {
                    println!("{line}");
                }
            }
            println!("replay: {}", replay_command(&run, &args.config));
            return ExitCode::from(1);
        }
        let done = seed - args.first + 1;
        if done % 100 == 0 || done == args.seeds {
            println!(
                "{done} seeds passed ({crashes} with a crash) in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    ExitCode::SUCCESS
}
