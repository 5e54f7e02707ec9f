//! `myriad cluster superpeer add|remove`: grows, shrinks or repairs the superpeer group of
//! a local cluster directory.
//!
//! # Job
//! - `add` starts a new superpeer process that joins the group
//!   ([`LocalCluster::spawn_superpeer`]: recorded in `cluster.json`, so `cluster status`,
//!   `stop` and `restart` know it), then has the leader add it (`AddSuperpeer`: a learner
//!   that catches up, then a voter). `--node NAME` retries the add of a superpeer recorded
//!   before (restarting its process first if it is down).
//! - `remove` has the leader remove a member (`RemoveSuperpeer`), then stops its process
//!   and forgets it ([`LocalCluster::remove_node`]).
//!
//! # Invariants
//! - A process is stopped only after the group no longer lists it, so the group never
//!   counts a stopped member in its quorum; a refused `remove` leaves everything running.
//! - `remove` refuses, before asking the group, to remove the last member, or a member
//!   whose removal would leave the new voter set (or the current one) without a quorum of
//!   members that answer: such a change could never commit and would block every later one.
//! - A definite refusal of `add` stops and forgets the process it started; an unknown
//!   outcome (leader lost, timeout) leaves it recorded (and running, if it runs), and says
//!   how to retry.
//!   Adding and removing are idempotent, so retrying either command after an unknown outcome
//!   is safe; a change refused because another one has not committed yet is retried by the
//!   command itself (saying so on stderr) until `--timeout-secs`, then reported.
//! - Every wait is bounded (`--timeout-secs`, the launcher's ready and stop timeouts).
//!
//! # Who calls it
//! [`crate::cluster::run`] for `myriad cluster superpeer ...`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use myriad_client::client::{Client, ClientConfig};
use myriad_client::ClientError;
use myriad_launcher::{LocalCluster, NodeEntry, NodeRole};
use myriad_meta::MetaError;
use myriad_proto::meta::{MetaReply, MetaRequest};
use myriad_types::NodeId;

/// Node IDs `add` picks from when no `--id` is given: high IDs, since peers take the
/// lowest free ones.
pub const ADDED_SUPERPEER_ID_FIRST: u16 = 100;
/// How long a member may take to answer the status probe of `remove`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// `myriad cluster superpeer` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum SuperpeerCommand {
    /// Start a new superpeer that joins the group, and add it (it catches up as a learner,
    /// then votes). With --node, retry adding a superpeer recorded before.
    Add(AddArgs),
    /// Remove a superpeer from the group, then stop its process and forget it.
    Remove(RemoveArgs),
}

/// Options of `myriad cluster superpeer add`.
#[derive(clap::Args, Debug)]
pub struct AddArgs {
    /// The cluster directory.
    #[arg(long)]
    dir: PathBuf,
    /// Node ID of the new superpeer (default: the lowest unused ID from 100 on).
    #[arg(long, conflicts_with = "node")]
    id: Option<u16>,
    /// Retry: add this recorded superpeer (name or node ID), restarting it if it is down.
    #[arg(long)]
    node: Option<String>,
    /// Longest wait for the group's answer, in seconds.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
}

/// Options of `myriad cluster superpeer remove`.
#[derive(clap::Args, Debug)]
pub struct RemoveArgs {
    /// The cluster directory.
    #[arg(long)]
    dir: PathBuf,
    /// The superpeer: name (`superpeer-3`) or node ID (decimal or 0x hex).
    #[arg(long)]
    node: String,
    /// Longest wait for the group's answer, in seconds.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
}

/// Runs a `myriad cluster superpeer` subcommand.
pub fn run(command: SuperpeerCommand) -> anyhow::Result<()> {
    match command {
        SuperpeerCommand::Add(args) => add(args),
        SuperpeerCommand::Remove(args) => remove(args),
    }
}

/// Joins the cluster of `cluster` as a client whose metadata requests wait up to `timeout`.
fn connect(cluster: &LocalCluster, timeout: Duration) -> anyhow::Result<Client> {
    let mut config =
        ClientConfig::new(cluster.superpeers()).with_secret_file(&cluster.secret_file())?;
    if let Some(tls) = cluster.tls_dir() {
        config = config.with_tls_dir(&tls, "client")?;
    }
    config.join.request_timeout = timeout;
    Client::connect_with(config).map_err(|error| {
        anyhow!(
            "no superpeer of {} answers ({error}); is the cluster running? (myriad cluster status --dir {})",
            cluster.dir().display(),
            cluster.dir().display()
        )
    })
}

/// The member list of a group answer, as `0x0001=127.0.0.1:P, ...`.
fn members_text(members: &[(NodeId, String)]) -> String {
    members
        .iter()
        .map(|(id, address)| format!("{id}={address}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a refusal says another membership change has not committed yet (openraft
/// allows one at a time).
fn in_progress(reason: &str) -> bool {
    reason.contains("undergoing")
        || reason.contains("in progress")
        || reason.contains("uncommitted")
}

/// A hint for refusals openraft gives while another change has not committed yet.
fn refusal_hint(reason: &str) -> &'static str {
    if in_progress(reason) {
        " (another membership change has not finished in time: retry once it has, e.g. \
         after a new leader is elected or the members it waits for run again)"
    } else {
        ""
    }
}

/// Pause between two attempts of a change refused because another one is in progress.
const IN_PROGRESS_PAUSE: Duration = Duration::from_millis(250);

/// Runs `change` until it is not refused for another change in progress, or `timeout`
/// passes (changes are idempotent, so repeating one is safe); says so on stderr.
fn retrying_in_progress<T>(
    timeout: Duration,
    mut change: impl FnMut() -> Result<T, ClientError>,
) -> Result<T, ClientError> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match change() {
            Err(ClientError::Meta(MetaError::InvalidArgument(reason)))
                if in_progress(&reason) && std::time::Instant::now() < deadline =>
            {
                eprintln!("another membership change is in progress ({reason}); retrying");
                std::thread::sleep(IN_PROGRESS_PAUSE);
            }
            other => return other,
        }
    }
}

fn add(args: AddArgs) -> anyhow::Result<()> {
    let mut cluster = LocalCluster::open(&args.dir)?;
    let timeout = Duration::from_secs(args.timeout_secs.max(1));
    let client = connect(&cluster, timeout)?;
    let result = add_with(&mut cluster, &client, &args, timeout);
    client.shutdown();
    result
}

fn add_with(
    cluster: &mut LocalCluster,
    client: &Client,
    args: &AddArgs,
    timeout: Duration,
) -> anyhow::Result<()> {
    let b = client.blocking();
    let (entry, started_here) = match &args.node {
        Some(node) => {
            let entry = cluster.find(node)?.clone();
            if entry.role != NodeRole::Superpeer {
                bail!("{} is a {}, not a superpeer", entry.name, entry.role);
            }
            let alive = cluster
                .status()
                .iter()
                .any(|status| status.node.name == entry.name && status.alive);
            let entry = if alive {
                entry
            } else {
                cluster
                    .restart(&entry.name)
                    .with_context(|| format!("restarting {}", entry.name))?
            };
            (entry, false)
        }
        None => {
            let nodes = b
                .nodes()
                .map_err(|error| anyhow!("reading the node table: {error}"))?;
            let taken: BTreeSet<u16> = nodes
                .iter()
                .map(|node| node.id.0)
                .chain(cluster.nodes().iter().map(|node| node.node_id))
                .collect();
            let id = match args.id {
                Some(id) if taken.contains(&id) => {
                    bail!("node ID {id} is taken (by a node of the node table or cluster.json)")
                }
                Some(id) => id,
                None => (ADDED_SUPERPEER_ID_FIRST..=myriad_types::limits::NODE_ID_MAX)
                    .find(|id| !taken.contains(id))
                    .ok_or_else(|| anyhow!("no unused node ID left"))?,
            };
            let entry = cluster
                .spawn_superpeer(id)
                .with_context(|| format!("starting superpeer {id}"))?;
            (entry, true)
        }
    };
    let id = NodeId(entry.node_id);
    let address: SocketAddr = entry
        .address
        .parse()
        .with_context(|| format!("{}'s address {:?}", entry.name, entry.address))?;
    match retrying_in_progress(timeout, || b.add_superpeer(id, address)) {
        Ok(status) => {
            if !status.members.iter().any(|(member, _)| *member == id) {
                bail!(
                    "the leader answered, but its group does not list {id}: {}; retry with \
                     myriad cluster superpeer add --dir {} --node {}",
                    members_text(&status.members),
                    args.dir.display(),
                    entry.name
                );
            }
            println!(
                "added {} (node {id}, {}, pid {}) to the superpeer group",
                entry.name, entry.address, entry.pid
            );
            println!("members: {}", members_text(&status.members));
            Ok(())
        }
        Err(ClientError::Meta(MetaError::InvalidArgument(reason))) => {
            if started_here {
                cluster.remove_node(&entry.name)?;
            }
            bail!(
                "the group refused to add {id}: {reason}{}{}",
                refusal_hint(&reason),
                if started_here {
                    "; the new superpeer was stopped and forgotten"
                } else {
                    ""
                }
            )
        }
        Err(error) => bail!(
            "adding {id} did not finish within {timeout:?} ({error}): the group may or may not \
             have added it. {} stays recorded in cluster.json; retry with `myriad cluster superpeer add --dir {} \
             --node {}`, or take it out with `myriad cluster superpeer remove --dir {} --node {}`",
            entry.name,
            args.dir.display(),
            entry.name,
            args.dir.display(),
            entry.name
        ),
    }
}

fn remove(args: RemoveArgs) -> anyhow::Result<()> {
    let mut cluster = LocalCluster::open(&args.dir)?;
    let recorded = cluster.find(&args.node).ok().cloned();
    let id = match (&recorded, myriad_launcher::parse_node_id(&args.node)) {
        (Some(entry), _) if entry.role != NodeRole::Superpeer => {
            bail!(
                "{} is a {}, not a superpeer (stop peers with `myriad term -c \"nodeshutdown {}\"`)",
                entry.name,
                entry.role,
                entry.node_id
            )
        }
        (Some(entry), _) => NodeId(entry.node_id),
        (None, Some(id)) => NodeId(id),
        (None, None) => bail!(
            "no superpeer {} in {}",
            args.node,
            args.dir.join(myriad_launcher::CLUSTER_FILE).display()
        ),
    };
    let timeout = Duration::from_secs(args.timeout_secs.max(1));
    let client = connect(&cluster, timeout)?;
    let result = remove_with(
        &mut cluster,
        &client,
        recorded.as_ref(),
        id,
        &args.dir,
        timeout,
    );
    client.shutdown();
    result
}

fn remove_with(
    cluster: &mut LocalCluster,
    client: &Client,
    recorded: Option<&NodeEntry>,
    id: NodeId,
    dir: &Path,
    timeout: Duration,
) -> anyhow::Result<()> {
    let b = client.blocking();
    let status = b
        .status()
        .map_err(|error| anyhow!("reading the group's status: {error}"))?;
    let members = status.members;
    if !members.iter().any(|(member, _)| *member == id) {
        let Some(entry) = recorded else {
            bail!(
                "{id} is not a member of the superpeer group (members: {})",
                members_text(&members)
            );
        };
        cluster.remove_node(&entry.name)?;
        println!(
            "{} (node {id}) is not a member of the group; its process was stopped and it was \
             forgotten",
            entry.name
        );
        return Ok(());
    }
    if members.len() == 1 {
        bail!(
            "{id} is the group's last superpeer and cannot be removed (add another one first, \
             or stop the whole cluster with `myriad cluster stop --dir {}`)",
            dir.display()
        );
    }
    check_quorum(client, &members, id)?;
    let members = match retrying_in_progress(timeout, || b.remove_superpeer(id)) {
        Ok(status) => status.members,
        Err(ClientError::Meta(MetaError::InvalidArgument(reason)))
            if reason.contains("not a member") =>
        {
            // An earlier attempt whose answer was lost removed it already.
            b.status()
                .map_err(|error| anyhow!("reading the group's status: {error}"))?
                .members
        }
        Err(ClientError::Meta(MetaError::InvalidArgument(reason))) => bail!(
            "the group refused to remove {id}: {reason}{}; nothing was stopped",
            refusal_hint(&reason)
        ),
        Err(error) => bail!(
            "removing {id} did not finish ({error}): the group may or may not have removed it; \
             nothing was stopped. Retry the same command (removing is idempotent)"
        ),
    };
    // The answer may come from a member that has not applied the last step of the
    // change yet (a joint configuration, a leader that removed itself): the removal
    // counts once a status leaves `id` out, read again for up to `timeout`.
    let mut members = members;
    let deadline = std::time::Instant::now() + timeout;
    while members.iter().any(|(member, _)| *member == id) {
        if std::time::Instant::now() >= deadline {
            bail!(
                "the group still lists {id} after its removal ({}): nothing was stopped; retry",
                members_text(&members)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        if let Ok(status) = b.status() {
            members = status.members;
        }
    }
    match recorded {
        Some(entry) => {
            cluster.remove_node(&entry.name)?;
            println!(
                "removed {} (node {id}) from the superpeer group and stopped it",
                entry.name
            );
        }
        None => println!(
            "removed node {id} from the superpeer group (not recorded in this cluster \
             directory: stop its process yourself)"
        ),
    }
    println!("members: {}", members_text(&members));
    Ok(())
}

/// Refuses the removal of `id` from `members` if the current group or the one without `id`
/// would lack a quorum of members that answer a status request: joint consensus needs a
/// majority of both to commit the change. `members` is the group as a superpeer reports it
/// (voters and learners alike), so a dead learner makes the check stricter than Raft, never
/// looser: remove dead learners first.
fn check_quorum(client: &Client, members: &[(NodeId, String)], id: NodeId) -> anyhow::Result<()> {
    let net = client.membership().net();
    let mut answering = BTreeSet::new();
    for (member, address) in members {
        if let Ok(address) = address.parse::<SocketAddr>() {
            net.set_address(*member, address);
        }
        let reply = net.request_blocking(
            *member,
            myriad_proto::types::META_REQUEST,
            MetaRequest::Status.encode(),
            PROBE_TIMEOUT,
        );
        if reply
            .ok()
            .and_then(|bytes| MetaReply::decode(bytes).ok())
            .is_some_and(|reply| matches!(reply, MetaReply::Status(_)))
        {
            answering.insert(*member);
        }
    }
    let majority = |count: usize| count / 2 + 1;
    let live = members
        .iter()
        .filter(|(member, _)| answering.contains(member))
        .count();
    if live < majority(members.len()) {
        bail!(
            "the group has no quorum now: {live} of its {} members answer ({} needed); start \
             the stopped members again first",
            members.len(),
            majority(members.len())
        );
    }
    let remaining: Vec<NodeId> = members
        .iter()
        .map(|(member, _)| *member)
        .filter(|member| *member != id)
        .collect();
    let live_remaining = remaining.iter().filter(|m| answering.contains(m)).count();
    if live_remaining < majority(remaining.len()) {
        let silent: Vec<String> = remaining
            .iter()
            .filter(|m| !answering.contains(m))
            .map(ToString::to_string)
            .collect();
        bail!(
            "removing {id} would leave the group without a quorum: only {live_remaining} of the \
             {} remaining members answer ({} needed; silent: {}). Start those again first, \
             then retry",
            remaining.len(),
            majority(remaining.len()),
            silent.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openraft_in_progress_refusals_are_recognised_and_others_are_not() {
        // The words of openraft's refusal (see crates/raft/tests/group_change.rs).
        let refusal = "the cluster is already undergoing a configuration change at log \
                       Some(LogId { .. }), last committed membership log id: Some(..)";
        assert!(in_progress(refusal));
        assert!(!refusal_hint(refusal).is_empty());
        let other = "superpeer 7 is not a member";
        assert!(!in_progress(other));
        assert!(refusal_hint(other).is_empty());
    }

    #[test]
    fn in_progress_refusals_are_retried_until_the_timeout_and_others_are_not() {
        let refused = || ClientError::Meta(MetaError::InvalidArgument("undergoing".into()));
        let mut calls = 0;
        let result = retrying_in_progress(Duration::from_secs(5), || {
            calls += 1;
            if calls < 3 {
                Err(refused())
            } else {
                Ok(calls)
            }
        });
        assert_eq!(result.ok(), Some(3));
        let mut calls = 0;
        let result: Result<(), _> = retrying_in_progress(Duration::ZERO, || {
            calls += 1;
            Err(refused())
        });
        assert!(result.is_err());
        assert_eq!(calls, 1, "no retry once the timeout passed");
        let mut calls = 0;
        let result: Result<(), _> = retrying_in_progress(Duration::from_secs(5), || {
            calls += 1;
            Err(ClientError::Meta(MetaError::InvalidArgument(
                "not a member".into(),
            )))
        });
        assert!(result.is_err());
        assert_eq!(calls, 1, "other refusals are final");
    }
}
