//! The terminal's operator commands added for issue 22: `nodedrain` (with a progress bar),
//! `nodewait`, `chunkremoverange`, `balance`, `monitoring`, `loggerlevel`, `loginfo`,
//! `chunklocklist`, `chunkdump`, `memdump` and `recoverywait` (with progress bars).
//!
//! # Job
//! Maps each command to `myriad-client` calls and returns plain JSON like every backend
//! call (see [`super::TermBackend`]).
//!
//! # Invariants
//! - Every call is bounded: `nodedrain` by the drain's pass limit and the migration
//!   timeouts, `nodewait` by its `--timeout`, `chunkremoverange` by the chunk timeouts of
//!   at most [`REMOVE_RANGE_MAX`] / [`REMOVE_BATCH`] batches, `balance` by its rounds
//!   (each a sampling window plus its migrations).
//! - Progress bars go to stderr and only when it is a terminal (indicatif hides them
//!   otherwise), so scripts and `--json` output never see them.
//!
//! # Who calls it
//! [`super::backend::ClientBackend`].

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use myriad_client::client::{BalanceOptions, Client, DrainOptions, DrainProgress};
use myriad_client::ClientError;
use myriad_meta::{NodeState, Role};
use myriad_proto::monitor::{MonitorQuery, MonitorReport};
use myriad_proto::recovery::RecoveryState;
use myriad_types::ChunkId;
use serde_json::{json, Value};

use super::TermCommand;

/// Most CIDs one `chunkremoverange` covers.
pub const REMOVE_RANGE_MAX: u64 = 10_000_000;
/// CIDs per remove request of `chunkremoverange`.
pub const REMOVE_BATCH: usize = 10_000;
/// How often `nodewait` reads the node table.
const NODE_WAIT_POLL: Duration = Duration::from_millis(200);

/// Runs one operator command.
pub fn dispatch(client: &Client, command: &TermCommand) -> Result<Value, String> {
    match command {
        TermCommand::NodeDrain {
            node,
            targets,
            piece,
        } => {
            let options = DrainOptions {
                targets: targets.clone(),
                piece_chunks: *piece,
                ..DrainOptions::default()
            };
            let bar = progress_bar("draining");
            let started = Instant::now();
            let mut show = |state: &DrainProgress| {
                bar.set_length(state.pass_chunks);
                bar.set_position(state.pass_moved);
                bar.set_message(format!("pass {}, {} moved", state.pass, state.moved));
            };
            let result = client.blocking().drain(*node, &options, &mut show);
            bar.finish_and_clear();
            let report = result.map_err(|error| error.to_string())?;
            Ok(json!({
                "node": node.to_string(),
                "moved": report.moved,
                "migrations": report.pieces,
                "passes": report.passes,
                "ms": started.elapsed().as_millis() as u64,
                "targets": report.per_target.iter().map(|(target, moved)| json!({
                    "nid": target.to_string(),
                    "moved": moved,
                })).collect::<Vec<_>>(),
            }))
        }
        TermCommand::NodeWait {
            peers,
            superpeers,
            timeout_secs,
        } => node_wait(client, *peers, *superpeers, *timeout_secs),
        TermCommand::ChunkRemoveRange { first, last } => remove_range(client, *first, *last),
        TermCommand::Monitoring { node, history } => monitoring(client, *node, *history),
        TermCommand::LoggerLevel { node, filter } => {
            let current = client
                .blocking()
                .log_level(*node, filter.clone())
                .map_err(|error| error.to_string())?;
            Ok(json!({"node": node.to_string(), "filter": current}))
        }
        TermCommand::ChunkLockList { node } => {
            let text = client
                .blocking()
                .lock_list(*node)
                .map_err(|error| error.to_string())?;
            serde_json::from_str(&text).map_err(|error| format!("{node} sent no JSON: {error}"))
        }
        TermCommand::ChunkDump { cid, path } => {
            let data = client
                .blocking()
                .chunks()
                .get(*cid)
                .map_err(|error| error.to_string())?;
            std::fs::write(path, &data).map_err(|error| format!("writing {path}: {error}"))?;
            Ok(json!({"cid": cid.to_string(), "file": path, "bytes": data.len()}))
        }
        TermCommand::MemDump { node, path } => mem_dump(client, *node, path),
        TermCommand::RecoveryWait { timeout_secs } => recovery_wait(client, *timeout_secs),
        TermCommand::LogInfo { node } => {
            let text = client
                .blocking()
                .log_info(*node)
                .map_err(|error| error.to_string())?;
            let mut value: Value = serde_json::from_str(&text)
                .map_err(|error| format!("{node} sent no JSON: {error}"))?;
            if let Value::Object(map) = &mut value {
                map.insert("node".to_owned(), json!(node.to_string()));
            }
            Ok(value)
        }
        TermCommand::Balance {
            rounds,
            window_ms,
            imbalance_percent,
            max_chunks,
        } => {
            let options = BalanceOptions {
                window: Duration::from_millis(u64::from(*window_ms)),
                imbalance: f64::from(*imbalance_percent) / 100.0,
                chunks_per_round_max: *max_chunks,
                ..BalanceOptions::default()
            };
            balance(client, *rounds, &options)
        }
        _ => unreachable!("dispatch routes only operator commands here"),
    }
}

/// A bar on stderr (hidden when stderr is no terminal).
pub(super) fn progress_bar(prefix: &'static str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    if let Ok(style) =
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} chunks {msg} ({elapsed})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(prefix);
    bar
}

/// `nodewait`: polls the node table until enough peers and superpeers are alive.
fn node_wait(
    client: &Client,
    peers: u32,
    superpeers: u32,
    timeout_secs: u32,
) -> Result<Value, String> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(u64::from(timeout_secs));
    loop {
        let nodes = client
            .blocking()
            .nodes()
            .map_err(|error| error.to_string())?;
        let alive = |role: Role| {
            nodes
                .iter()
                .filter(|node| node.role == role && node.state == NodeState::Alive)
                .count()
        };
        let (have_peers, have_superpeers) = (alive(Role::Peer), alive(Role::Superpeer));
        if have_peers >= peers as usize && have_superpeers >= superpeers as usize {
            return Ok(json!({
                "peers": have_peers,
                "superpeers": have_superpeers,
                "waited_ms": started.elapsed().as_millis() as u64,
            }));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "after {timeout_secs} s: {have_peers} of {peers} peers and {have_superpeers} \
                 of {superpeers} superpeers alive"
            ));
        }
        std::thread::sleep(NODE_WAIT_POLL);
    }
}

/// `chunkremoverange`: removes `first..=last` in batches; CIDs without a chunk are
/// counted, not errors.
fn remove_range(client: &Client, first: ChunkId, last: ChunkId) -> Result<Value, String> {
    let count = last.local_id() - first.local_id() + 1;
    if count > REMOVE_RANGE_MAX {
        return Err(format!(
            "{count} CIDs: at most {REMOVE_RANGE_MAX} per chunkremoverange"
        ));
    }
    let creator = first.creator();
    let cids: Vec<ChunkId> = (first.local_id()..=last.local_id())
        .filter_map(|lid| ChunkId::new(creator, lid))
        .collect();
    let bar = progress_bar("removing");
    bar.set_length(cids.len() as u64);
    let (mut removed, mut absent) = (0u64, 0u64);
    let b = client.blocking();
    let chunks = b.chunks();
    for batch in cids.chunks(REMOVE_BATCH) {
        for (cid, result) in batch.iter().zip(chunks.remove_batch(batch)) {
            match result {
                Ok(()) => removed += 1,
                Err(ClientError::NotFound(_)) => absent += 1,
                Err(error) => {
                    bar.finish_and_clear();
                    return Err(format!(
                        "removing {cid}: {error} (after {removed} chunks were removed)"
                    ));
                }
            }
        }
        bar.inc(batch.len() as u64);
    }
    bar.finish_and_clear();
    Ok(json!({
        "first": first.to_string(),
        "last": last.to_string(),
        "removed": removed,
        "absent": absent,
    }))
}

/// CID ranges as `FIRST..LAST` separated by spaces ("-" for none).
fn ranges_text(ranges: &[(myriad_types::ChunkId, myriad_types::ChunkId)]) -> String {
    if ranges.is_empty() {
        return "-".to_owned();
    }
    ranges
        .iter()
        .map(|(first, last)| format!("{first}..{last}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `balance`: rounds until one moves nothing (or `rounds` ran); one row per round.
fn balance(client: &Client, rounds: u32, options: &BalanceOptions) -> Result<Value, String> {
    let mut rows = Vec::new();
    for round in 1..=rounds {
        let outcome = client
            .blocking()
            .balance_round(options)
            .map_err(|error| format!("round {round}: {error}"))?;
        let loads: Vec<String> = outcome
            .loads
            .iter()
            .map(|load| {
                format!(
                    "{}:{:.0}/s:{}",
                    load.node, load.requests_per_sec, load.chunks
                )
            })
            .collect();
        rows.push(json!({
            "round": round,
            "loads": loads.join(" "),
            "from": outcome.moved_between.map(|(from, _)| from.to_string()),
            "to": outcome.moved_between.map(|(_, to)| to.to_string()),
            "moved": outcome.moved,
            "ranges": ranges_text(&outcome.moved_ranges),
            "decision": outcome.decision,
        }));
        if outcome.moved == 0 {
            break;
        }
    }
    Ok(Value::Array(rows))
}

/// `monitoring`: every peer's rates between its last two reports, or one peer's history
/// (one row per report interval).
fn monitoring(
    client: &Client,
    node: Option<myriad_types::NodeId>,
    history: u32,
) -> Result<Value, String> {
    let query = MonitorQuery {
        node,
        history: if node.is_some() { history + 1 } else { 2 },
    };
    let reply = client
        .blocking()
        .monitoring(query)
        .map_err(|error| error.to_string())?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64);
    if let Some(node) = node {
        let Some((_, reports)) = reply.nodes.iter().find(|(id, _)| *id == node) else {
            return Err(format!(
                "the superpeers have no monitoring reports of {node}"
            ));
        };
        return Ok(Value::Array(
            reports
                .windows(2)
                .map(|pair| {
                    let mut row = json!({"age_s": age_s(now_ms, &pair[1])});
                    merge_rates(&mut row, &pair[0], &pair[1]);
                    merge_hot(&mut row, &pair[1], usize::MAX);
                    row
                })
                .collect(),
        ));
    }
    Ok(Value::Array(
        reply
            .nodes
            .iter()
            .filter_map(|(id, reports)| {
                let newest = reports.last()?;
                let mut row = json!({"nid": id.to_string(), "age_s": age_s(now_ms, newest)});
                match reports.len() {
                    0 | 1 => merge_rates(&mut row, newest, newest),
                    n => merge_rates(&mut row, &reports[n - 2], newest),
                }
                merge_hot(&mut row, newest, HOT_RANGES_SHOWN);
                Some(row)
            })
            .collect(),
    ))
}

/// Hot ranges per peer in the cluster table of `monitoring` (a node's history shows all).
const HOT_RANGES_SHOWN: usize = 3;

/// Adds `report`'s hottest CID ranges (at most `max`) to the object `row`, as one text:
/// `FIRST..LAST:RATE/s`, hottest first, space-separated ("-" for none).
fn merge_hot(row: &mut Value, report: &MonitorReport, max: usize) {
    let text: Vec<String> = report
        .hot_ranges
        .iter()
        .take(max)
        .map(|range| {
            format!(
                "{}..{}:{}/s",
                range.first, range.last, range.requests_per_sec
            )
        })
        .collect();
    if let Value::Object(map) = row {
        let shown = if text.is_empty() {
            "-".to_owned()
        } else {
            text.join(" ")
        };
        map.insert("hot_ranges".to_owned(), json!(shown));
    }
}

/// Seconds since `report` was taken.
fn age_s(now_ms: u64, report: &MonitorReport) -> f64 {
    (now_ms.saturating_sub(report.unix_ms) as f64 / 100.0).round() / 10.0
}

/// Adds the rates between `old` and `new` (zero when they are the same report) and the
/// levels of `new` to the object `row`.
fn merge_rates(row: &mut Value, old: &MonitorReport, new: &MonitorReport) {
    let seconds = new.unix_ms.saturating_sub(old.unix_ms) as f64 / 1_000.0;
    let rate = |a: u64, b: u64| {
        if seconds > 0.0 {
            (b.saturating_sub(a) as f64 / seconds).round()
        } else {
            0.0
        }
    };
    let kib = |a: u64, b: u64| (rate(a, b) / 1_024.0 * 10.0).round() / 10.0;
    let cpu = if seconds > 0.0 {
        (new.cpu_ms.saturating_sub(old.cpu_ms) as f64 / seconds / 10.0 * 10.0).round() / 10.0
    } else {
        0.0
    };
    if let Value::Object(map) = row {
        let mib = |bytes: u64| (bytes as f64 / f64::from(1 << 20) * 10.0).round() / 10.0;
        for (key, value) in [
            ("cpu_pct", json!(cpu)),
            ("rss_mib", json!(mib(new.rss_bytes))),
            (
                "net_tx_kib_s",
                json!(kib(old.net_sent_bytes, new.net_sent_bytes)),
            ),
            (
                "net_rx_kib_s",
                json!(kib(old.net_received_bytes, new.net_received_bytes)),
            ),
            (
                "disk_kib_s",
                json!(kib(old.disk_written_bytes, new.disk_written_bytes)),
            ),
            (
                "requests_s",
                json!(rate(old.requests_served, new.requests_served)),
            ),
            ("chunks", json!(new.chunks)),
            ("payload_mib", json!(mib(new.payload_bytes))),
            ("free_mib", json!(mib(new.free_bytes))),
        ] {
            map.insert(key.to_owned(), value);
        }
    }
}

/// Chunks `memdump` reads per request.
const DUMP_BATCH: usize = 1_000;
/// Most CID ranges `memdump` lists.
const DUMP_RANGES_MAX: u64 = 1_000_000;

/// `memdump`: every chunk `node` holds, written to `path` as `cid (u64 LE), length (u32
/// LE), bytes` per chunk, in the order of the peer's listing. A chunk removed meanwhile is
/// left out.
fn mem_dump(client: &Client, node: myriad_types::NodeId, path: &str) -> Result<Value, String> {
    use std::io::Write;
    let b = client.blocking();
    let chunks = b.chunks();
    let (ranges, truncated) = chunks
        .list(node, None, DUMP_RANGES_MAX)
        .map_err(|error| error.to_string())?;
    if truncated {
        return Err(format!(
            "{node} holds more than {DUMP_RANGES_MAX} CID ranges"
        ));
    }
    let total: u64 = ranges
        .iter()
        .map(|(first, last)| last.local_id() - first.local_id() + 1)
        .sum();
    let file = std::fs::File::create(path).map_err(|error| format!("creating {path}: {error}"))?;
    let mut out = std::io::BufWriter::new(file);
    let bar = progress_bar("dumping");
    bar.set_length(total);
    let (mut dumped, mut bytes) = (0u64, 0u64);
    let cids = ranges.iter().flat_map(|(first, last)| {
        (first.local_id()..=last.local_id()).filter_map(|lid| ChunkId::new(first.creator(), lid))
    });
    let mut batch = Vec::with_capacity(DUMP_BATCH);
    let mut write_batch = |batch: &mut Vec<ChunkId>| -> Result<(), String> {
        for (cid, result) in batch.iter().zip(chunks.get_batch(batch)) {
            let data = match result {
                Ok(data) => data,
                Err(ClientError::NotFound(_)) => continue,
                Err(error) => return Err(format!("reading {cid}: {error}")),
            };
            let length =
                u32::try_from(data.len()).map_err(|_| format!("{cid} is larger than 4 GiB"))?;
            out.write_all(&cid.raw().to_le_bytes())
                .and_then(|()| out.write_all(&length.to_le_bytes()))
                .and_then(|()| out.write_all(&data))
                .map_err(|error| format!("writing {path}: {error}"))?;
            dumped += 1;
            bytes += data.len() as u64;
        }
        bar.inc(batch.len() as u64);
        batch.clear();
        Ok(())
    };
    for cid in cids {
        batch.push(cid);
        if batch.len() == DUMP_BATCH {
            write_batch(&mut batch)?;
        }
    }
    write_batch(&mut batch)?;
    bar.finish_and_clear();
    out.flush()
        .map_err(|error| format!("writing {path}: {error}"))?;
    Ok(json!({"node": node.to_string(), "file": path, "chunks": dumped, "bytes": bytes}))
}

/// How often `recoverywait` reads the leader's recovery table.
const RECOVERY_POLL: Duration = Duration::from_millis(200);

/// `recoverywait`: follows the leader's recovery table (a bar of finished zones over all)
/// until no zone is pending, running or waiting; the counts by state.
fn recovery_wait(client: &Client, timeout_secs: u32) -> Result<Value, String> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(u64::from(timeout_secs));
    let bar = ProgressBar::new(0);
    if let Ok(style) =
        ProgressStyle::with_template("recovering [{bar:30}] {pos}/{len} zones {msg} ({elapsed})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    loop {
        let status = client
            .blocking()
            .recovery_status()
            .map_err(|error| error.to_string());
        let status = match status {
            Ok(status) => status,
            Err(error) => {
                bar.finish_and_clear();
                return Err(error);
            }
        };
        let count = |state: RecoveryState| {
            status
                .zones
                .iter()
                .filter(|zone| zone.state == state)
                .count()
        };
        let open = count(RecoveryState::Pending)
            + count(RecoveryState::Running)
            + count(RecoveryState::Waiting);
        let zones = status.zones.len();
        bar.set_length(zones as u64);
        bar.set_position((zones - open) as u64);
        bar.set_message(format!("{} restored", count(RecoveryState::Done)));
        if open == 0 {
            bar.finish_and_clear();
            return Ok(json!({
                "zones": zones,
                "done": count(RecoveryState::Done),
                "failed": count(RecoveryState::Failed),
                "lost": count(RecoveryState::Lost),
                "chunks": status.zones.iter().map(|zone| zone.chunks).sum::<u64>(),
                "waited_ms": started.elapsed().as_millis() as u64,
            }));
        }
        if Instant::now() >= deadline {
            bar.finish_and_clear();
            return Err(format!(
                "after {timeout_secs} s: {open} of {zones} zones still being recovered"
            ));
        }
        std::thread::sleep(RECOVERY_POLL);
    }
}
