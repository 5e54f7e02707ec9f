//! Where the terminal meets the cluster: [`connect`] builds the [`TermBackend`] for a list
//! of superpeers, and [`ClientBackend`] maps every [`TermCommand`] to a `myriad-client`
//! call.
//!
//! # Job
//! [`ClientBackend`] joins the cluster as a client node (role `Client`, an ID assigned by
//! the superpeers) on the first command that needs the cluster, so `help` never waits for
//! a network. It then runs each command through the blocking client API and returns plain
//! JSON (see the [`TermBackend`] contract): node IDs as `NodeId`'s `Display` (`0x0002`),
//! CIDs as `ChunkId`'s (`0x0002000000000001`), chunk data through [`DataFormat::show`].
//!
//! # Invariants
//! - The client leaves the cluster when the backend is dropped (the shell's end, also
//!   after a failed one-shot command): peers then release every chunk lock it held, so a
//!   lock taken by `myriad term -c "chunklock ..."` lasts only as long as that process.
//!   A terminal killed by a signal (Ctrl-C during a long command) does not leave: the
//!   superpeers declare its client failed instead, which releases its locks as well.
//! - `chunkunlock` releases the kind of lock (read or write) this terminal took on that
//!   CID; a CID this terminal did not lock is refused without asking the peer.
//! - `nodeshutdown` only ever sends [`types::NODE_SHUTDOWN`] to a live peer, or to a
//!   superpeer that is no longer a member of the Raft group: for a superpeer it first has
//!   the leader remove it (`superpeerremove`), checks the group no longer lists it, and
//!   only then asks the process to stop, so the group never counts a stopped member in
//!   its quorum. Clients do not handle that message type and are refused.
//! - A failed connection attempt is remembered for [`CONNECT_RETRY_AFTER`] only: the
//!   commands of one `-c` line fail at once with the same reason, while a later command
//!   of an interactive terminal (which may be started before its cluster) tries again.
//! - Every call is bounded: joining and metadata requests by [`CONNECT_TIMEOUT`], chunk
//!   calls by the client's chunk timeouts, waits by the constants below.
//!
//! # Who calls it
//! [`super::main`] through [`connect`]; the shell runs every parsed command but `help`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use myriad_client::client::{BlockingClient, Client, ClientConfig};
use myriad_client::ClientError;
use myriad_meta::{Capabilities, NodeRecord, NodeState, Role};
use myriad_proto::chunk::ChunkStats;
use myriad_proto::types;
use myriad_types::{ChunkId, NodeId};
use serde_json::{json, Value};

use super::{RoleFilter, TermBackend, TermCommand};

/// Longest wait to join the cluster, and deadline of each metadata request.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a failed connection attempt answers later commands without a new attempt.
pub const CONNECT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Longest wait of `barriersignon` for the other participants.
pub const BARRIER_WAIT: Duration = Duration::from_secs(30);
/// Longest wait of `chunklock` for the lock at the owner.
pub const LOCK_WAIT: Duration = Duration::from_secs(5);
/// Longest wait for a peer's answer to `nodeshutdown`.
pub const SHUTDOWN_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait after `nodeshutdown` for the node table to show the peer left.
pub const SHUTDOWN_LEAVE_WAIT: Duration = Duration::from_secs(10);
/// Chunks created per request by `chunkcreate` with a count.
pub const CREATE_BATCH_MAX: usize = 10_000;
/// Most CID ranges `chunklist` asks a peer for.
pub const LIST_RANGES_MAX: u64 = 100_000;

/// Builds the backend for the cluster reached through `superpeers` (ID, `host:port`)
/// with the cluster secret `secret` (or why there is none).
///
/// Nothing is contacted here: the backend joins on its first command. An empty or
/// malformed list, or no secret, gives a backend that fails every command with the reason.
pub fn connect(
    superpeers: &[(u16, String)],
    secret: Result<Vec<u8>, String>,
    tls: Result<Option<myriad_net::TlsConfig>, String>,
) -> Box<dyn TermBackend> {
    if superpeers.is_empty() {
        return Box::new(UnconnectedBackend {
            reason: "no cluster given (use --cluster DIR or --superpeers LIST)".to_string(),
        });
    }
    let secret = match secret {
        Ok(secret) => secret,
        Err(reason) => return Box::new(UnconnectedBackend { reason }),
    };
    let tls = match tls {
        Ok(tls) => tls,
        Err(reason) => return Box::new(UnconnectedBackend { reason }),
    };
    let mut parsed = Vec::with_capacity(superpeers.len());
    for (id, address) in superpeers {
        match address.parse::<SocketAddr>() {
            Ok(address) => parsed.push((NodeId(*id), address)),
            Err(_) => {
                return Box::new(UnconnectedBackend {
                    reason: format!("invalid address {address:?} of superpeer {}", NodeId(*id)),
                })
            }
        }
    }
    Box::new(ClientBackend::new(parsed, secret).with_tls(tls))
}

/// A backend that fails every command with one reason.
#[derive(Debug, Clone)]
pub struct UnconnectedBackend {
    /// Why nothing can run.
    pub reason: String,
}

impl TermBackend for UnconnectedBackend {
    fn run(&mut self, _command: &TermCommand) -> Result<Value, String> {
        Err(self.reason.clone())
    }
}

/// The terminal's backend over a `myriad-client` [`Client`] (joined lazily, left on drop).
pub struct ClientBackend {
    superpeers: Vec<(NodeId, SocketAddr)>,
    /// The cluster secret (never shown: not in `Debug` either).
    secret: Vec<u8>,
    /// TLS for the terminal's connections (`None`: plain TCP).
    tls: Option<myriad_net::TlsConfig>,
    client: Option<Client>,
    /// The last failed connection attempt: when it ended and why.
    failed: Option<(Instant, String)>,
    /// Locks this terminal holds: CID → write lock (`false`: read lock).
    locks: HashMap<ChunkId, bool>,
}

impl std::fmt::Debug for ClientBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBackend")
            .field("superpeers", &self.superpeers)
            .field("client", &self.client.as_ref().map(Client::node_id))
            .field("locks", &self.locks.len())
            .finish()
    }
}

impl ClientBackend {
    /// A backend for these superpeers and this cluster secret; nothing is contacted until
    /// the first command.
    pub fn new(superpeers: Vec<(NodeId, SocketAddr)>, secret: Vec<u8>) -> ClientBackend {
        ClientBackend {
            superpeers,
            secret,
            tls: None,
            client: None,
            failed: None,
            locks: HashMap::new(),
        }
    }

    /// Turns TLS on for the terminal's connections.
    pub fn with_tls(mut self, tls: Option<myriad_net::TlsConfig>) -> ClientBackend {
        self.tls = tls;
        self
    }

    /// The joined client, joining first if needed.
    fn client(&mut self) -> Result<Client, String> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        if let Some((when, reason)) = &self.failed {
            if when.elapsed() < CONNECT_RETRY_AFTER {
                return Err(reason.clone());
            }
        }
        let mut config = ClientConfig::new(self.superpeers.clone());
        config.join.request_timeout = CONNECT_TIMEOUT;
        config.join.secret = self.secret.clone();
        config.join.tls = self.tls.clone();
        // The terminal stores nothing and runs nothing for others.
        config.join.capabilities = Capabilities(0);
        let list: Vec<String> = self
            .superpeers
            .iter()
            .map(|(id, address)| format!("{id}={address}"))
            .collect();
        let client = match Client::connect_with(config) {
            Ok(client) => client,
            Err(error) => {
                let reason = format!(
                    "could not connect to the cluster through {} within {} s: {error}",
                    list.join(","),
                    CONNECT_TIMEOUT.as_secs()
                );
                self.failed = Some((Instant::now(), reason.clone()));
                return Err(reason);
            }
        };
        self.failed = None;
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Runs `command` through the handler of its family.
    fn dispatch(&mut self, client: &Client, command: &TermCommand) -> Result<Value, String> {
        match command {
            TermCommand::Help { .. } => Err("help is answered by the shell".to_string()),
            TermCommand::NodeList { .. }
            | TermCommand::NodeInfo { .. }
            | TermCommand::NodeShutdown { .. } => self.dispatch_node(client, command),
            TermCommand::ChunkCreate { .. }
            | TermCommand::ChunkGet { .. }
            | TermCommand::ChunkPut { .. }
            | TermCommand::ChunkList { .. }
            | TermCommand::ChunkStatus { .. }
            | TermCommand::ChunkMigrate { .. } => dispatch_chunk(client, command),
            TermCommand::ChunkRemove { .. }
            | TermCommand::ChunkLock { .. }
            | TermCommand::ChunkUnlock { .. } => self.dispatch_chunk_lock(client, command),
            TermCommand::NameReg { .. } | TermCommand::NameGet { .. } | TermCommand::NameList => {
                dispatch_name(client, command)
            }
            TermCommand::BarrierAlloc { .. }
            | TermCommand::BarrierSignOn { .. }
            | TermCommand::BarrierStatus { .. }
            | TermCommand::BarrierFree { .. }
            | TermCommand::BarrierSize { .. } => dispatch_barrier(client, command),
            TermCommand::TmpCreate { .. }
            | TermCommand::TmpGet { .. }
            | TermCommand::TmpPut { .. }
            | TermCommand::TmpRemove { .. }
            | TermCommand::TmpList => dispatch_tmp(client, command),
            TermCommand::LookupTree { .. }
            | TermCommand::Metadata { .. }
            | TermCommand::Recovery
            | TermCommand::Stats { .. }
            | TermCommand::SuperpeerAdd { .. }
            | TermCommand::SuperpeerRemove { .. } => dispatch_cluster(client, command),
            TermCommand::CompGroupList
            | TermCommand::CompGroupStatus { .. }
            | TermCommand::CompTask { .. }
            | TermCommand::CompTaskScript { .. }
            | TermCommand::Graph500 { .. }
            | TermCommand::CompGroupJoin { .. }
            | TermCommand::CompApp { .. } => super::compute::dispatch(client, command),
            TermCommand::NodeDrain { .. }
            | TermCommand::NodeWait { .. }
            | TermCommand::ChunkRemoveRange { .. }
            | TermCommand::Balance { .. }
            | TermCommand::Monitoring { .. }
            | TermCommand::LoggerLevel { .. }
            | TermCommand::LogInfo { .. }
            | TermCommand::ChunkLockList { .. }
            | TermCommand::ChunkDump { .. }
            | TermCommand::MemDump { .. }
            | TermCommand::RecoveryWait { .. } => super::ops::dispatch(client, command),
        }
    }

    /// The node commands: `nodelist`, `nodeinfo`, `nodeshutdown`.
    fn dispatch_node(&mut self, client: &Client, command: &TermCommand) -> Result<Value, String> {
        let b = client.blocking();
        let chunks = b.chunks();
        match command {
            TermCommand::NodeList { role } => {
                let nodes = b.nodes().map_err(text)?;
                Ok(Value::Array(
                    nodes
                        .iter()
                        .filter(|node| match role {
                            None => true,
                            Some(RoleFilter::Superpeer) => node.role == Role::Superpeer,
                            Some(RoleFilter::Peer) => node.role == Role::Peer,
                        })
                        .map(node_json)
                        .collect(),
                ))
            }
            TermCommand::NodeInfo { node } => {
                let record = find_node(client, *node)?;
                let mut value = node_json(&record);
                if let Value::Object(map) = &mut value {
                    map.insert("this_terminal".into(), json!(record.id == client.node_id()));
                    if record.role == Role::Peer && record.state == NodeState::Alive {
                        match chunks.stats(*node) {
                            Ok(stats) => {
                                map.insert("chunks".into(), stats_json(&stats));
                            }
                            Err(error) => {
                                map.insert("chunks_error".into(), json!(error.to_string()));
                            }
                        }
                    }
                }
                Ok(value)
            }
            TermCommand::NodeShutdown { node, kill } => self.shutdown_node(client, *node, *kill),
            _ => unreachable!("dispatch routes only node commands here"),
        }
    }

    /// The chunk commands that change this terminal's locks: `chunkremove`, `chunklock`,
    /// `chunkunlock`.
    fn dispatch_chunk_lock(
        &mut self,
        client: &Client,
        command: &TermCommand,
    ) -> Result<Value, String> {
        let b = client.blocking();
        let chunks = b.chunks();
        match command {
            TermCommand::ChunkRemove { cid } => {
                chunks.remove(*cid).map_err(text)?;
                self.locks.remove(cid);
                Ok(Value::Null)
            }
            TermCommand::ChunkLock { cid, write } => {
                if let Some(held) = self.locks.get(cid) {
                    return Err(format!(
                        "this terminal already holds a {} lock on {cid}",
                        lock_kind(*held)
                    ));
                }
                chunks.lock(*cid, *write, LOCK_WAIT).map_err(text)?;
                self.locks.insert(*cid, *write);
                Ok(json!({"cid": cid.to_string(), "lock": lock_kind(*write)}))
            }
            TermCommand::ChunkUnlock { cid } => {
                let Some(&write) = self.locks.get(cid) else {
                    return Err(format!(
                        "this terminal holds no lock on {cid} (locks belong to the client \
                         that took them and end when it leaves)"
                    ));
                };
                chunks.unlock(*cid, write).map_err(text)?;
                self.locks.remove(cid);
                Ok(Value::Null)
            }
            _ => unreachable!("dispatch routes only chunk lock commands here"),
        }
    }

    /// `nodeshutdown`: asks a live peer to leave and exit, then waits (bounded) until the
    /// node table shows it gone.
    fn shutdown_node(
        &mut self,
        client: &Client,
        node: NodeId,
        kill: bool,
    ) -> Result<Value, String> {
        if kill {
            return Err(format!(
                "the terminal cannot kill remote processes; for a local cluster use \
                 `myriad cluster kill --dir DIR --node {node}` (or nodeshutdown {node} for a clean exit)"
            ));
        }
        let record = find_node(client, node)?;
        match record.role {
            Role::Superpeer => return shutdown_superpeer(client, &record),
            Role::Client => {
                return Err(format!(
                    "{node} is a client: clients leave on their own and cannot be shut down"
                ))
            }
            Role::Peer => {}
        }
        if record.state != NodeState::Alive {
            return Err(format!(
                "{node} is not alive ({})",
                state_text(record.state)
            ));
        }
        client
            .membership()
            .net()
            .request_blocking(
                node,
                types::NODE_SHUTDOWN,
                Bytes::new(),
                SHUTDOWN_REQUEST_TIMEOUT,
            )
            .map_err(|error| format!("{node} did not accept the shutdown request: {error}"))?;
        let deadline = Instant::now() + SHUTDOWN_LEAVE_WAIT;
        let mut state = record.state;
        while Instant::now() < deadline {
            if let Ok(nodes) = client.blocking().nodes() {
                if let Some(now) = nodes.iter().find(|n| n.id == node) {
                    state = now.state;
                    if state != NodeState::Alive {
                        break;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(json!({
            "node": node.to_string(),
            "shutdown": "requested",
            "state": state_text(state),
        }))
    }
}

/// `nodeshutdown` of a superpeer: leaves the Raft group (through the leader), then asks
/// the process to stop, then waits (bounded) until its address refuses connections.
fn shutdown_superpeer(client: &Client, record: &NodeRecord) -> Result<Value, String> {
    let node = record.id;
    let b = client.blocking();
    let members = match b.remove_superpeer(node) {
        Ok(status) => status.members,
        Err(error) => {
            // Refused because it already left? Then stopping it is safe.
            let status = b.status().map_err(|status_error| {
                format!("{node} could not leave the group ({error}), and the group status is unknown ({status_error}): not stopped")
            })?;
            if status.members.iter().any(|(id, _)| *id == node) {
                return Err(format!(
                    "{node} could not leave the superpeer group, so it is not stopped: {error}"
                ));
            }
            status.members
        }
    };
    if members.iter().any(|(id, _)| *id == node) {
        return Err(format!(
            "{node} is still listed in the superpeer group after its removal: not stopped"
        ));
    }
    let address = record.address.parse::<SocketAddr>().ok();
    if let Some(address) = address {
        client.membership().net().set_address(node, address);
    }
    client
        .membership()
        .net()
        .request_blocking(
            node,
            types::NODE_SHUTDOWN,
            Bytes::new(),
            SHUTDOWN_REQUEST_TIMEOUT,
        )
        .map_err(|error| {
            format!(
                "{node} left the superpeer group but did not accept the shutdown request: {error}"
            )
        })?;
    let deadline = Instant::now() + SHUTDOWN_LEAVE_WAIT;
    let mut stopped = false;
    while let Some(address) = address {
        if std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_err() {
            stopped = true;
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(json!({
        "node": node.to_string(),
        "shutdown": "requested",
        "left_group": true,
        "stopped": stopped,
        "members": members.iter().map(|(id, address)| json!({
            "nid": id.to_string(),
            "address": address,
        })).collect::<Vec<_>>(),
    }))
}

impl TermBackend for ClientBackend {
    fn run(&mut self, command: &TermCommand) -> Result<Value, String> {
        let client = self.client()?;
        self.dispatch(&client, command)
    }
}

impl Drop for ClientBackend {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            client.shutdown();
        }
    }
}
/// The other chunk commands (`chunk*`), which leave this terminal's locks alone.
fn dispatch_chunk(client: &Client, command: &TermCommand) -> Result<Value, String> {
    let b = client.blocking();
    let chunks = b.chunks();
    match command {
        TermCommand::ChunkCreate { size, node, count } => {
            let mut created = Vec::with_capacity(*count as usize);
            let mut left = *count as usize;
            // A load of more than one batch shows its progress (stderr, terminals only).
            let bar = (left > CREATE_BATCH_MAX).then(|| {
                let bar = super::ops::progress_bar("creating");
                bar.set_length(u64::from(*count));
                bar
            });
            while left > 0 {
                let batch = left.min(CREATE_BATCH_MAX);
                let cids = if batch == 1 {
                    vec![chunks.create(*node, u64::from(*size)).map_err(text)?]
                } else {
                    chunks
                        .create_batch(*node, &vec![u64::from(*size); batch])
                        .map_err(|error| partial(format!("{error}"), created.len(), "created"))?
                };
                left -= batch;
                created.extend(cids);
                if let Some(bar) = &bar {
                    bar.set_position(created.len() as u64);
                }
            }
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            Ok(Value::Array(
                created
                    .iter()
                    .map(|cid| json!({"cid": cid.to_string()}))
                    .collect(),
            ))
        }
        TermCommand::ChunkGet {
            cid,
            format,
            offset,
            length,
        } => {
            let data = match (offset, length) {
                (0, None) => chunks.get(*cid).map_err(text)?,
                (offset, Some(length)) => chunks
                    .read_at(*cid, u64::from(*offset), u64::from(*length))
                    .map_err(text)?,
                (offset, None) => {
                    let size = chunks.status(*cid).map_err(text)?;
                    let offset = u64::from(*offset);
                    if offset > size {
                        return Err(format!(
                            "offset {offset} is beyond the end of chunk {cid} ({size} bytes)"
                        ));
                    }
                    chunks.read_at(*cid, offset, size - offset).map_err(text)?
                }
            };
            Ok(json!({
                "cid": cid.to_string(),
                "offset": offset,
                "length": data.len(),
                "data": format.show(&data),
            }))
        }
        TermCommand::ChunkPut { cid, data, offset } => {
            chunks
                .write_at(*cid, u64::from(*offset), Bytes::copy_from_slice(data))
                .map_err(text)?;
            Ok(Value::Null)
        }
        TermCommand::ChunkList { node } => {
            let (ranges, truncated) = chunks.list(*node, None, LIST_RANGES_MAX).map_err(text)?;
            Ok(json!({
                "node": node.to_string(),
                "ranges": ranges
                    .iter()
                    .map(|(first, last)| json!({
                        "first": first.to_string(),
                        "last": last.to_string(),
                        "chunks": last.local_id() - first.local_id() + 1,
                    }))
                    .collect::<Vec<_>>(),
                "truncated": truncated,
            }))
        }
        TermCommand::ChunkStatus { node } => {
            let stats = chunks.stats(*node).map_err(text)?;
            let mut value = json!({"node": node.to_string()});
            merge(&mut value, stats_json(&stats));
            Ok(value)
        }
        TermCommand::ChunkMigrate { first, last, to } => {
            let moved = b.migrate(*first, *last, *to).map_err(text)?;
            Ok(json!({
                "first": first.to_string(),
                "last": last.to_string(),
                "to": to.to_string(),
                "moved": moved,
            }))
        }
        _ => unreachable!("dispatch routes only chunk commands here"),
    }
}

/// The nameservice commands: `namereg`, `nameget`, `namelist`.
fn dispatch_name(client: &Client, command: &TermCommand) -> Result<Value, String> {
    let b = client.blocking();
    match command {
        TermCommand::NameReg { cid, name } => {
            b.name_register(name, *cid).map_err(text)?;
            Ok(Value::Null)
        }
        TermCommand::NameGet { name } => match b.name_get(name).map_err(text)? {
            Some(cid) => Ok(json!({"name": name, "cid": cid.to_string()})),
            None => Err(format!("no chunk is registered under {name:?}")),
        },
        TermCommand::NameList => Ok(Value::Array(
            b.name_list()
                .map_err(text)?
                .iter()
                .map(|(name, cid)| json!({"name": name, "cid": cid.to_string()}))
                .collect(),
        )),
        _ => unreachable!("dispatch routes only nameservice commands here"),
    }
}

/// The barrier commands (`barrier*`).
fn dispatch_barrier(client: &Client, command: &TermCommand) -> Result<Value, String> {
    let b = client.blocking();
    match command {
        TermCommand::BarrierAlloc { size } => {
            let id = b.barrier_alloc(*size).map_err(text)?;
            Ok(json!({"barrier": id, "size": size}))
        }
        TermCommand::BarrierSignOn { barrier, data } => {
            let values = b
                .barrier_sign_on(*barrier, *data, BARRIER_WAIT)
                .map_err(text)?;
            Ok(Value::Array(values.iter().map(value_row).collect()))
        }
        TermCommand::BarrierStatus { barrier } => match b.barrier_status(*barrier) {
            Ok(Some(status)) => Ok(json!({
                "barrier": barrier,
                "size": status.size,
                "round": status.round,
                "signed": status.signed,
                "last_released": status.last_released.iter().map(value_row).collect::<Vec<_>>(),
            })),
            Ok(None) => Err(format!("no barrier {barrier}")),
            Err(error) => Err(error.to_string()),
        },
        TermCommand::BarrierFree { barrier } => {
            b.barrier_free(*barrier).map_err(text)?;
            Ok(Value::Null)
        }
        TermCommand::BarrierSize { barrier, size } => {
            b.barrier_resize(*barrier, *size).map_err(text)?;
            Ok(Value::Null)
        }
        _ => unreachable!("dispatch routes only barrier commands here"),
    }
}

/// The temporary storage commands (`tmp*`).
fn dispatch_tmp(client: &Client, command: &TermCommand) -> Result<Value, String> {
    let b = client.blocking();
    match command {
        TermCommand::TmpCreate { id, size } => {
            b.tmp_create(&id.to_string(), Bytes::from(vec![0u8; *size as usize]))
                .map_err(text)?;
            Ok(Value::Null)
        }
        TermCommand::TmpGet { id, format } => match b.tmp_get(&id.to_string()) {
            Ok(Some(data)) => Ok(json!({
                "id": id,
                "size": data.len(),
                "data": format.show(&data),
            })),
            Ok(None) => Err(format!("no temporary storage entry {id}")),
            Err(error) => Err(error.to_string()),
        },
        TermCommand::TmpPut { id, data } => {
            let name = id.to_string();
            let Some(old) = b.tmp_get(&name).map_err(text)? else {
                return Err(format!(
                    "no temporary storage entry {id} (tmpcreate {id} <size> first)"
                ));
            };
            if data.len() > old.len() {
                return Err(format!(
                    "{} bytes do not fit in entry {id} ({} bytes)",
                    data.len(),
                    old.len()
                ));
            }
            let mut new = old.to_vec();
            new[..data.len()].copy_from_slice(data);
            b.tmp_put(&name, Bytes::from(new)).map_err(text)?;
            Ok(Value::Null)
        }
        TermCommand::TmpRemove { id } => {
            let name = id.to_string();
            if b.tmp_get(&name).map_err(text)?.is_none() {
                return Err(format!("no temporary storage entry {id}"));
            }
            b.tmp_remove(&name).map_err(text)?;
            Ok(Value::Null)
        }
        TermCommand::TmpList => Ok(Value::Array(
            b.tmp_list()
                .map_err(text)?
                .iter()
                .map(|(name, size)| {
                    let id = name
                        .parse::<u32>()
                        .map_or_else(|_| json!(name), |id| json!(id));
                    json!({"id": id, "size": size})
                })
                .collect(),
        )),
        _ => unreachable!("dispatch routes only temporary storage commands here"),
    }
}

/// `lookuptree`: the ranges of `node`'s chunks that migrated, and their owners.
fn lookup_tree(b: &BlockingClient<'_>, node: NodeId) -> Result<Value, String> {
    let ranges = b.lookup_tree(node).map_err(text)?;
    let mut rows = Vec::with_capacity(ranges.len());
    for (first, last, owner) in ranges {
        let (Some(first), Some(last)) = (ChunkId::new(node, first), ChunkId::new(node, last))
        else {
            return Err(format!(
                "the superpeers returned an invalid range {first}..={last}"
            ));
        };
        rows.push(json!({
            "first": first.to_string(),
            "last": last.to_string(),
            "owner": owner.to_string(),
        }));
    }
    Ok(Value::Array(rows))
}

/// `metadata`: the superpeer group's status, and one node's detail if asked for.
/// The group after a change: leader, term and members.
fn group_json(status: &myriad_proto::meta::StatusReply) -> Result<Value, String> {
    Ok(json!({
        "answered_by": status.node.to_string(),
        "leader": status.leader.map(|id| id.to_string()),
        "term": status.term,
        "members": status.members.iter().map(|(id, address)| json!({
            "nid": id.to_string(),
            "address": address,
        })).collect::<Vec<_>>(),
    }))
}

fn metadata(b: &BlockingClient<'_>, node: Option<NodeId>) -> Result<Value, String> {
    let status = b.status().map_err(text)?;
    let nodes = b.nodes().map_err(text)?;
    let count = |role: Role| {
        nodes
            .iter()
            .filter(|n| n.role == role && n.state == NodeState::Alive)
            .count()
    };
    let mut value = json!({
        "answered_by": status.node.to_string(),
        "leader": status.leader.map(|id| id.to_string()),
        "term": status.term,
        "epoch": status.epoch,
        "last_log_index": status.last_log_index,
        "applied_index": status.last_applied_index,
        "alive_superpeers": count(Role::Superpeer),
        "alive_peers": count(Role::Peer),
        "alive_clients": count(Role::Client),
        "members": status.members.iter().map(|(id, address)| json!({
            "nid": id.to_string(),
            "address": address,
        })).collect::<Vec<_>>(),
    });
    if let Some(node) = node {
        let record = nodes
            .iter()
            .find(|record| record.id == node)
            .ok_or_else(|| format!("no node {node}"))?;
        let mut detail = node_json(record);
        if record.role == Role::Peer {
            let tree = lookup_tree(b, node)?;
            let zones = b.zones(node).map_err(text)?;
            merge(
                &mut detail,
                json!({
                    "migrated_ranges": tree,
                    "backup_zones": zones.iter().map(|(zone, backups)| json!({
                        "zone": zone,
                        "backups": backups.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                    })).collect::<Vec<_>>(),
                }),
            );
        }
        merge(&mut value, json!({ "node": detail }));
    }
    Ok(value)
}

/// The cluster-wide views: `lookuptree`, `metadata`, `recovery`, `stats`.
fn dispatch_cluster(client: &Client, command: &TermCommand) -> Result<Value, String> {
    let b = client.blocking();
    let chunks = b.chunks();
    match command {
        TermCommand::LookupTree { node } => lookup_tree(&b, *node),
        TermCommand::Metadata { node } => metadata(&b, *node),
        TermCommand::SuperpeerAdd { node, address } => {
            let address = address
                .parse::<SocketAddr>()
                .map_err(|_| format!("invalid address {address:?}"))?;
            group_json(&b.add_superpeer(*node, address).map_err(text)?)
        }
        TermCommand::SuperpeerRemove { node } => {
            group_json(&b.remove_superpeer(*node).map_err(text)?)
        }
        TermCommand::Recovery => {
            let status = b.recovery_status().map_err(text)?;
            Ok(Value::Array(
                status
                    .zones
                    .iter()
                    .map(|zone| {
                        json!({
                            "owner": zone.owner.to_string(),
                            "zone": zone.zone,
                            "state": format!("{:?}", zone.state).to_lowercase(),
                            "restorer": zone.restorer.map(|id| id.to_string()),
                            "chunks": zone.chunks,
                            "ms": zone.ms,
                            "detail": zone.detail,
                        })
                    })
                    .collect(),
            ))
        }
        TermCommand::Stats { node: Some(node) } => {
            let stats = chunks.stats(*node).map_err(text)?;
            let mut value = json!({"node": node.to_string()});
            merge(&mut value, stats_json(&stats));
            Ok(value)
        }
        TermCommand::Stats { node: None } => {
            let nodes = b.nodes().map_err(text)?;
            Ok(Value::Array(
                nodes
                    .iter()
                    .filter(|n| n.role == Role::Peer && n.state == NodeState::Alive)
                    .map(|n| {
                        let (stats, error) = match chunks.stats(n.id) {
                            Ok(stats) => (Some(stats), None),
                            Err(error) => (None, Some(error.to_string())),
                        };
                        json!({
                            "node": n.id.to_string(),
                            "chunks": stats.map(|s| s.chunks),
                            "payload_bytes": stats.map(|s| s.payload_bytes),
                            "used_bytes": stats.map(|s| s.used_bytes),
                            "free_bytes": stats.map(|s| s.free_bytes),
                            "region_bytes": stats.map(|s| s.region_bytes),
                            "error": error,
                        })
                    })
                    .collect(),
            ))
        }
        _ => unreachable!("dispatch routes only cluster view commands here"),
    }
}

/// A client error as a one-line message.
fn text(error: ClientError) -> String {
    error.to_string()
}

/// An error after part of a multi-request command had succeeded.
fn partial(error: String, done: usize, what: &str) -> String {
    if done == 0 {
        error
    } else {
        format!("{error} (after {done} chunks were {what})")
    }
}

fn lock_kind(write: bool) -> &'static str {
    if write {
        "write"
    } else {
        "read"
    }
}

/// The superpeers' record of `node`.
fn find_node(client: &Client, node: NodeId) -> Result<NodeRecord, String> {
    client
        .blocking()
        .nodes()
        .map_err(text)?
        .into_iter()
        .find(|record| record.id == node)
        .ok_or_else(|| format!("no node {node} in the cluster"))
}

fn role_text(role: Role) -> &'static str {
    match role {
        Role::Superpeer => "superpeer",
        Role::Peer => "peer",
        Role::Client => "client",
    }
}

fn state_text(state: NodeState) -> String {
    match state {
        NodeState::Alive => "alive".into(),
        NodeState::Failed { epoch } => format!("failed (epoch {epoch})"),
        NodeState::Left => "left".into(),
    }
}

fn capabilities_text(capabilities: Capabilities) -> String {
    let names: Vec<&str> = [
        (Capabilities::STORAGE, "storage"),
        (Capabilities::BACKUP, "backup"),
        (Capabilities::COMPUTE, "compute"),
    ]
    .iter()
    .filter(|(flag, _)| capabilities.contains(*flag))
    .map(|(_, name)| *name)
    .collect();
    if names.is_empty() {
        "-".into()
    } else {
        names.join(",")
    }
}

/// One node as a row of `nodelist` (and the base of `nodeinfo`).
fn node_json(record: &NodeRecord) -> Value {
    json!({
        "nid": record.id.to_string(),
        "role": role_text(record.role),
        "state": state_text(record.state),
        "address": record.address,
        "rack": record.rack,
        "switch": record.switch,
        "capabilities": capabilities_text(record.capabilities),
        "incarnation": record.incarnation,
    })
}

fn stats_json(stats: &ChunkStats) -> Value {
    json!({
        "chunks": stats.chunks,
        "payload_bytes": stats.payload_bytes,
        "used_bytes": stats.used_bytes,
        "free_bytes": stats.free_bytes,
        "region_bytes": stats.region_bytes,
        "rereplication_pending": stats.rereplication_pending,
    })
}

/// One participant's value of a barrier round.
fn value_row((node, value): &(NodeId, u64)) -> Value {
    json!({"node": node.to_string(), "data": value})
}

/// Appends `extra`'s keys to the object `value` (both objects).
fn merge(value: &mut Value, extra: Value) {
    if let (Value::Object(map), Value::Object(extra)) = (value, extra) {
        map.extend(extra);
    }
}
