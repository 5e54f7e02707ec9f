//! `myriad term`: the terminal shell (DXTerm's commands) over a cluster.
//!
//! # Job
//! Reads commands interactively (line editing and history through rustyline), from `-c
//! "cmd; cmd2"`, or line by line from a non-terminal stdin; parses them into
//! [`TermCommand`]s ([`commands`]); runs each through a [`TermBackend`]; prints each result
//! as text ([`render`]) or, with `--json`, as one JSON value per command (an error is
//! `{"error": "...", "command": "..."}`).
//!
//! # Invariants
//! - A whole line is parsed before any of its commands runs: a typo in the third command
//!   of `-c` runs none of them.
//! - `help` is answered by the shell itself and never reaches the backend.
//! - One-shot and piped modes exit nonzero if any command failed or did not parse; the
//!   interactive mode reports errors and goes on.
//! - History is kept in `$XDG_STATE_HOME/myriad/history`, else `~/.myriad_history`; a
//!   history file that cannot be read or written is silently ignored.
//!
//! # Who calls it
//! `main.rs` (`myriad term`). The backend over `myriad-client` is built by
//! [`backend::connect`]; the shell is dropped before the process exits (also on a
//! failed one-shot command), so the terminal's client leaves the cluster.

pub mod backend;
pub mod commands;
pub mod compute;
pub mod ops;
pub mod render;
#[cfg(test)]
mod tests;

use std::io::{self, BufRead, IsTerminal, Write};
use std::path::PathBuf;

use serde_json::{json, Value};

// Tests name some of these through `term::`.
#[allow(unused_imports)]
pub use commands::{parse_line, DataFormat, ParseError, RoleFilter, TermCommand};

/// Runs one parsed command against the cluster.
///
/// Contract for implementations:
/// - Return plain JSON, never preformatted text: an array of objects for lists (one object
///   per row, same keys in the same order), an object for one record, `null` for "done".
/// - Show CIDs as `ChunkId`'s `Display` (`0x` + 16 hex digits) and node IDs as `NodeId`'s
///   (`0x` + 4 hex digits), so output can be pasted back as input.
/// - Show chunk data with [`DataFormat::show`] of the command's format.
/// - Return `Err` with a one-line message for any failure; never panic.
/// - [`TermCommand::Help`] is never passed in.
pub trait TermBackend {
    /// Runs `command` and returns its result.
    fn run(&mut self, command: &TermCommand) -> Result<Value, String>;
}

impl<B: TermBackend + ?Sized> TermBackend for Box<B> {
    fn run(&mut self, command: &TermCommand) -> Result<Value, String> {
        (**self).run(command)
    }
}

/// Options of `myriad term`.
#[derive(clap::Args, Debug, Clone)]
pub struct TermArgs {
    /// Run these `;`-separated commands and exit (nonzero if any fails).
    #[arg(short = 'c', long = "command")]
    pub command: Option<String>,
    /// Print each result as one JSON value per line.
    #[arg(long)]
    pub json: bool,
    /// A local cluster directory (superpeer addresses from DIR/cluster.json).
    #[arg(long, conflicts_with = "superpeers")]
    pub cluster: Option<PathBuf>,
    /// Superpeers as `1=127.0.0.1:P1,2=127.0.0.1:P2`.
    #[arg(long)]
    pub superpeers: Option<String>,
    /// File holding the cluster secret (mode 0600); default: $MYRIAD_SECRET_FILE, else
    /// the `--cluster` directory's secret file.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// TLS: the certificate directory and name (see `myriad cert`).
    #[command(flatten)]
    pub tls: crate::TlsArgs,
}

/// What running some input did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Commands that ran successfully.
    pub succeeded: usize,
    /// Commands that failed, plus lines that did not parse.
    pub failed: usize,
}

impl Outcome {
    fn add(&mut self, other: Outcome) {
        self.succeeded += other.succeeded;
        self.failed += other.failed;
    }
}

/// The shell: parses lines, runs them through a backend, prints results.
pub struct Shell<B: TermBackend> {
    backend: B,
    json: bool,
}

impl<B: TermBackend> Shell<B> {
    /// A shell over `backend`; `json` selects JSON output.
    pub fn new(backend: B, json: bool) -> Self {
        Shell { backend, json }
    }

    /// Parses and runs one line; results go to `out`, errors to `err` (in JSON mode both
    /// go to `out`, one value per command).
    pub fn run_line(
        &mut self,
        line: &str,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> io::Result<Outcome> {
        let mut outcome = Outcome::default();
        let commands = match parse_line(line) {
            Ok(commands) => commands,
            Err(error) => {
                outcome.failed += 1;
                if self.json {
                    let command = error.command.clone().map_or(Value::Null, Value::String);
                    writeln!(
                        out,
                        "{}",
                        json!({"error": error.to_string(), "command": command})
                    )?;
                } else {
                    writeln!(err, "error: {error}")?;
                }
                return Ok(outcome);
            }
        };
        for command in &commands {
            let result = match command {
                TermCommand::Help { command } => help(command.as_deref()),
                other => self.backend.run(other),
            };
            match result {
                Ok(value) => {
                    outcome.succeeded += 1;
                    if self.json {
                        writeln!(out, "{value}")?;
                    } else {
                        out.write_all(render::render(&value).as_bytes())?;
                    }
                }
                Err(message) => {
                    outcome.failed += 1;
                    if self.json {
                        writeln!(
                            out,
                            "{}",
                            json!({"error": message, "command": command.name()})
                        )?;
                    } else {
                        writeln!(err, "error: {}: {message}", command.name())?;
                    }
                }
            }
        }
        Ok(outcome)
    }

    /// Runs every line of `input` (a script or piped stdin); `#` starts a comment line.
    pub fn run_lines(
        &mut self,
        input: &mut dyn BufRead,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> io::Result<Outcome> {
        let mut outcome = Outcome::default();
        let mut line = String::new();
        loop {
            line.clear();
            if input.read_line(&mut line)? == 0 {
                return Ok(outcome);
            }
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            outcome.add(self.run_line(trimmed, out, err)?);
        }
    }

    /// The interactive loop with line editing and history; returns on `exit`, `quit`,
    /// or end of input.
    pub fn interactive(&mut self) -> anyhow::Result<()> {
        use rustyline::error::ReadlineError;
        let mut editor = rustyline::DefaultEditor::new()?;
        let history = history_path();
        if let Some(path) = &history {
            let _ = editor.load_history(path);
        }
        println!("myriad terminal: help lists the commands, exit leaves");
        let stdout = io::stdout();
        let stderr = io::stderr();
        loop {
            match editor.readline("myriad> ") {
                Ok(line) => {
                    let trimmed = line.trim();
                    if trimmed.is_empty() {
                        continue;
                    }
                    let _ = editor.add_history_entry(trimmed);
                    if matches!(trimmed, "exit" | "quit") {
                        break;
                    }
                    self.run_line(trimmed, &mut stdout.lock(), &mut stderr.lock())?;
                }
                Err(ReadlineError::Interrupted) => continue,
                Err(ReadlineError::Eof) => break,
                Err(error) => return Err(error.into()),
            }
        }
        if let Some(path) = &history {
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            let _ = editor.save_history(path);
        }
        Ok(())
    }
}

/// The answer of `help` / `help <command>`.
fn help(command: Option<&str>) -> Result<Value, String> {
    match command {
        None => Ok(Value::Array(
            commands::COMMANDS
                .iter()
                .map(|spec| json!({"command": spec.name, "usage": spec.usage, "summary": spec.summary}))
                .collect(),
        )),
        Some(name) => commands::command_spec(name)
            .map(|spec| json!({"command": spec.name, "usage": spec.usage, "summary": spec.summary}))
            .ok_or_else(|| format!("unknown command {name:?}")),
    }
}

/// Where the history is kept, if anywhere.
fn history_path() -> Option<PathBuf> {
    if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(state).join("myriad").join("history"));
    }
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(|home| PathBuf::from(home).join(".myriad_history"))
}

/// Parses a `--superpeers` list: `1=127.0.0.1:P1,2=127.0.0.1:P2`.
pub fn parse_superpeers(list: &str) -> Result<Vec<(u16, String)>, String> {
    list.split(',')
        .filter(|entry| !entry.trim().is_empty())
        .map(|entry| {
            let (id, address) = entry
                .split_once('=')
                .ok_or_else(|| format!("superpeer {entry:?} is not ID=ADDRESS"))?;
            let id = commands::parse_u64(id)
                .and_then(|id| u16::try_from(id).ok())
                .ok_or_else(|| format!("invalid superpeer ID {id:?}"))?;
            address
                .trim()
                .parse::<std::net::SocketAddr>()
                .map_err(|_| format!("invalid superpeer address {address:?}"))?;
            Ok((id, address.trim().to_string()))
        })
        .collect()
}

/// Runs `myriad term`; exits the process with status 1 if a one-shot or piped command
/// failed.
pub fn main(args: TermArgs) -> anyhow::Result<()> {
    let mut secret_file = crate::secret_file_arg(args.secret_file.as_deref());
    let mut tls_args = args.tls.clone();
    let superpeers = match (&args.cluster, &args.superpeers) {
        (Some(dir), _) => {
            let cluster = myriad_launcher::LocalCluster::open(dir)?;
            secret_file.get_or_insert_with(|| cluster.secret_file());
            if tls_args.tls_dir.is_none() {
                if let Some(tls) = cluster.tls_dir() {
                    tls_args.tls_dir = Some(tls);
                    tls_args.tls_name = Some("client".to_owned());
                }
            }
            cluster.superpeer_addresses()
        }
        (None, Some(list)) => parse_superpeers(list).map_err(anyhow::Error::msg)?,
        (None, None) => Vec::new(),
    };
    let secret = match &secret_file {
        Some(path) => myriad_net::secret::read_file(path).map_err(|error| error.to_string()),
        None => Err(
            "no cluster secret: give --secret-file FILE or set MYRIAD_SECRET_FILE \
                     (a cluster started by `myriad cluster start` keeps it in DIR/secret)"
                .to_string(),
        ),
    };
    let tls = tls_args.load().map_err(|error| error.to_string());
    let backend = backend::connect(&superpeers, secret, tls);
    let mut shell = Shell::new(backend, args.json);
    let outcome = if let Some(script) = &args.command {
        shell.run_line(script, &mut io::stdout().lock(), &mut io::stderr().lock())?
    } else if io::stdin().is_terminal() {
        return shell.interactive();
    } else {
        shell.run_lines(
            &mut io::stdin().lock(),
            &mut io::stdout().lock(),
            &mut io::stderr().lock(),
        )?
    };
    io::stdout().flush()?;
    // Leave the cluster before exiting: `process::exit` runs no destructors.
    drop(shell);
    if outcome.failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
