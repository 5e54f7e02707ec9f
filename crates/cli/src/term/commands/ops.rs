//! Parsers of the operator commands added for issue 22: `chunkremoverange`, `nodedrain`,
//! `nodewait`, `balance`, `monitoring`,
//! `loggerlevel`, `loginfo`, `chunklocklist`, `chunkdump`, `memdump` and `recoverywait`.
//!
//! # Invariants
//! Same as the [parent](super): never panics; limits are checked here so the backend only
//! sees valid values (a range of one creator in order, a piece of 1..=2^20 CIDs, a wait of
//! at most [`NODE_WAIT_SECS_MAX`] seconds).
//!
//! # Who calls it
//! [`super::parse_tokens`].

use myriad_types::NodeId;

use super::{no_parser, parse_u64, Args, ParseError, TermCommand};

/// Most rounds of one `balance`.
pub const BALANCE_ROUNDS_MAX: u32 = 1_000;
/// Longest `nodewait` / `recoverywait` `--timeout` accepted, in seconds.
pub const NODE_WAIT_SECS_MAX: u32 = 3_600;
/// CIDs per migration request of `nodedrain` unless `--piece` says otherwise.
pub const DRAIN_PIECE_DEFAULT: u64 = myriad_client::client::DRAIN_PIECE_CHUNKS;

/// Parses one of this module's commands.
pub(super) fn parse(a: &Args<'_>, name: &str) -> Result<TermCommand, ParseError> {
    let command = match name {
        "chunkremoverange" => {
            a.count(2, 2)?;
            let (first, last) = (a.cid(0)?, a.cid(1)?);
            if last.creator() != first.creator() || last < first {
                return Err(a.error(format!(
                    "range {first}..{last} must lie within one creator, first <= last"
                )));
            }
            TermCommand::ChunkRemoveRange { first, last }
        }
        "nodedrain" => {
            a.count(1, 1)?;
            let node = a.node(0)?;
            let targets = match a.option("to") {
                Some(list) => node_list(a, list)?,
                None => Vec::new(),
            };
            if targets.contains(&node) {
                return Err(a.error(format!("{node} cannot take its own chunks")));
            }
            let piece = match a.option("piece") {
                Some(text) => parse_u64(text)
                    .filter(|n| (1..=1 << 20).contains(n))
                    .ok_or_else(|| a.error(format!("invalid --piece {text:?} (1..=1048576)")))?,
                None => DRAIN_PIECE_DEFAULT,
            };
            TermCommand::NodeDrain {
                node,
                targets,
                piece,
            }
        }
        "recoverywait" => {
            a.count(0, 0)?;
            let timeout_secs = a.option_u32("timeout")?.unwrap_or(60);
            if timeout_secs == 0 || timeout_secs > NODE_WAIT_SECS_MAX {
                return Err(a.error(format!("--timeout must be 1..={NODE_WAIT_SECS_MAX}")));
            }
            TermCommand::RecoveryWait { timeout_secs }
        }
        "nodewait" => {
            a.count(0, 0)?;
            let timeout_secs = a.option_u32("timeout")?.unwrap_or(60);
            if timeout_secs == 0 || timeout_secs > NODE_WAIT_SECS_MAX {
                return Err(a.error(format!("--timeout must be 1..={NODE_WAIT_SECS_MAX}")));
            }
            TermCommand::NodeWait {
                peers: a.option_u32("peers")?.unwrap_or(1),
                superpeers: a.option_u32("superpeers")?.unwrap_or(1),
                timeout_secs,
            }
        }
        "balance" => {
            a.count(0, 0)?;
            let rounds = a.option_u32("rounds")?.unwrap_or(1);
            if rounds == 0 || rounds > BALANCE_ROUNDS_MAX {
                return Err(a.error(format!("--rounds must be 1..={BALANCE_ROUNDS_MAX}")));
            }
            let window_ms = a.option_u32("window-ms")?.unwrap_or(1_000);
            if !(10..=60_000).contains(&window_ms) {
                return Err(a.error("--window-ms must be 10..=60000"));
            }
            let imbalance_percent = match a.option("imbalance") {
                Some(text) => text
                    .parse::<f64>()
                    .ok()
                    .filter(|x| (1.0..=100.0).contains(x))
                    .map(|x| (x * 100.0).round() as u32)
                    .ok_or_else(|| {
                        a.error(format!("invalid --imbalance {text:?} (a factor 1..=100)"))
                    })?,
                None => 150,
            };
            let max_chunks = match a.option("max-chunks") {
                Some(text) => parse_u64(text)
                    .filter(|n| *n > 0)
                    .ok_or_else(|| a.error(format!("invalid --max-chunks {text:?}")))?,
                None => 100_000,
            };
            TermCommand::Balance {
                rounds,
                window_ms,
                imbalance_percent,
                max_chunks,
            }
        }
        "monitoring" => {
            a.count(0, 1)?;
            let history = a.option_u32("history")?.unwrap_or(150);
            if history == 0 || history > 4_096 {
                return Err(a.error("--history must be 1..=4096"));
            }
            TermCommand::Monitoring {
                node: a.optional_node(0)?,
                history,
            }
        }
        "loggerlevel" => {
            a.count(1, 2)?;
            let filter = a.get(1).map(str::to_owned);
            if filter.as_ref().is_some_and(|text| text.trim().is_empty()) {
                return Err(a.error("an empty filter"));
            }
            TermCommand::LoggerLevel {
                node: a.node(0)?,
                filter,
            }
        }
        "loginfo" => {
            a.count(1, 1)?;
            TermCommand::LogInfo { node: a.node(0)? }
        }
        "chunklocklist" => {
            a.count(1, 1)?;
            TermCommand::ChunkLockList { node: a.node(0)? }
        }
        "chunkdump" => {
            a.count(2, 2)?;
            TermCommand::ChunkDump {
                cid: a.cid(0)?,
                path: a.required(1)?.to_owned(),
            }
        }
        "memdump" => {
            a.count(2, 2)?;
            TermCommand::MemDump {
                node: a.node(0)?,
                path: a.required(1)?.to_owned(),
            }
        }
        other => return Err(no_parser(other)),
    };
    Ok(command)
}

/// A `,`-separated list of node IDs.
fn node_list(a: &Args<'_>, list: &str) -> Result<Vec<NodeId>, ParseError> {
    list.split(',')
        .filter(|word| !word.trim().is_empty())
        .map(|word| {
            parse_u64(word)
                .and_then(|n| u16::try_from(n).ok())
                .map(NodeId)
                .ok_or_else(|| a.error(format!("invalid node ID {word:?} in --to")))
        })
        .collect()
}
