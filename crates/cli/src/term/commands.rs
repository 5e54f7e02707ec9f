//! The terminal's command language: tokenizer, the typed [`TermCommand`], its parser and
//! the usage text of every command.
//!
//! # Syntax
//! A line holds commands separated by `;`. Words are separated by blanks; `"..."` quotes
//! with `\"`, `\\`, `\n`, `\t`, `\xHH` escapes and `'...'` quotes literally; a quoted word is
//! never taken as an option. Options are `--name` or `--name value`. Values:
//! - chunk IDs: `0x1234000000000001`, a decimal number, or `creator:local` like DXTerm
//!   (`1:5`, `0x1:0x5`);
//! - node IDs: decimal or `0x` hex (16 bits);
//! - data (`chunkput`, `tmpput`): a string, or with a format word `hex` (`0a0b..`, an
//!   optional `0x`), `u8`..`u64` / `i8`..`i64` (one number, little-endian);
//! - output formats (`chunkget`, `tmpget`): `str` (default), `hex`, `u8`..`u64`, `i8`..`i64`
//!   (every whole little-endian value in the data).
//!
//! # Invariants
//! - Parsing never panics, whatever the input (a property test feeds it random lines).
//! - A line longer than [`LINE_BYTES_MAX`] or with more than [`COMMANDS_PER_LINE_MAX`]
//!   commands is refused before it is parsed.
//!
//! # Who calls it
//! [`super::Shell`] for interactive and one-shot input; the backend receives only parsed
//! commands.

mod compute;
mod ops;

use std::fmt;

use myriad_types::{ChunkId, NodeId};
use serde_json::{json, Value};

/// Longest input line accepted.
pub const LINE_BYTES_MAX: usize = 1 << 20;
/// Most commands on one line.
pub const COMMANDS_PER_LINE_MAX: usize = 1024;
/// Most chunks one `chunkcreate` may create.
pub const CREATE_COUNT_MAX: u32 = 1_000_000;
/// Largest chunk size `chunkcreate` / `tmpcreate` accept (the protocol's limit).
pub const CHUNK_BYTES_MAX: u32 = myriad_proto::limits::CHUNK_BYTES_MAX as u32;
const _: () = assert!(myriad_proto::limits::CHUNK_BYTES_MAX <= u32::MAX as usize);
/// Longest nameservice name accepted.
pub const NAME_BYTES_MAX: usize = 255;

/// How data bytes are written or shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataFormat {
    /// UTF-8 text (lossy when shown).
    Str,
    /// Hexadecimal bytes.
    Hex,
    /// Little-endian unsigned integers of 1, 2, 4 or 8 bytes.
    Unsigned(u8),
    /// Little-endian signed integers of 1, 2, 4 or 8 bytes.
    Signed(u8),
}

impl DataFormat {
    /// Parses `str`, `hex`, `u8`..`u64`, `i8`..`i64` (also `byte`, `short`, `int`, `long`).
    pub fn parse(word: &str) -> Option<DataFormat> {
        Some(match word.to_ascii_lowercase().as_str() {
            "str" | "string" => DataFormat::Str,
            "hex" => DataFormat::Hex,
            "u8" => DataFormat::Unsigned(1),
            "u16" => DataFormat::Unsigned(2),
            "u32" => DataFormat::Unsigned(4),
            "u64" => DataFormat::Unsigned(8),
            "i8" | "byte" => DataFormat::Signed(1),
            "i16" | "short" => DataFormat::Signed(2),
            "i32" | "int" => DataFormat::Signed(4),
            "i64" | "long" => DataFormat::Signed(8),
            _ => return None,
        })
    }

    /// Encodes one data word in this format.
    pub fn encode(self, text: &str) -> Result<Vec<u8>, String> {
        match self {
            DataFormat::Str => Ok(text.as_bytes().to_vec()),
            DataFormat::Hex => parse_hex(text),
            DataFormat::Unsigned(width) => {
                let value = parse_u64(text).ok_or_else(|| format!("not a number: {text:?}"))?;
                let bytes = value.to_le_bytes();
                let width = usize::from(width);
                if width < 8 && value >> (8 * width) != 0 {
                    return Err(format!("{value} does not fit in {} bits", 8 * width));
                }
                Ok(bytes[..width].to_vec())
            }
            DataFormat::Signed(width) => {
                let value: i64 = text
                    .parse()
                    .map_err(|_| format!("not a signed number: {text:?}"))?;
                let width = usize::from(width);
                let bits = 8 * width as u32;
                if bits < 64 {
                    let (low, high) = (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1);
                    if value < low || value > high {
                        return Err(format!("{value} does not fit in {bits} bits"));
                    }
                }
                Ok(value.to_le_bytes()[..width].to_vec())
            }
        }
    }

    /// Shows `bytes` in this format: a string, or an array of numbers (trailing bytes that
    /// do not fill a whole value are left out).
    pub fn show(self, bytes: &[u8]) -> Value {
        match self {
            DataFormat::Str => Value::String(String::from_utf8_lossy(bytes).into_owned()),
            DataFormat::Hex => Value::String(bytes.iter().map(|b| format!("{b:02x}")).collect()),
            DataFormat::Unsigned(width) => Value::Array(
                bytes
                    .chunks_exact(usize::from(width))
                    .map(|chunk| {
                        let mut word = [0u8; 8];
                        word[..chunk.len()].copy_from_slice(chunk);
                        json!(u64::from_le_bytes(word))
                    })
                    .collect(),
            ),
            DataFormat::Signed(width) => Value::Array(
                bytes
                    .chunks_exact(usize::from(width))
                    .map(|chunk| {
                        let negative = chunk.last().is_some_and(|b| b & 0x80 != 0);
                        let mut word = [if negative { 0xff } else { 0 }; 8];
                        word[..chunk.len()].copy_from_slice(chunk);
                        json!(i64::from_le_bytes(word))
                    })
                    .collect(),
            ),
        }
    }
}

impl fmt::Display for DataFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataFormat::Str => f.write_str("str"),
            DataFormat::Hex => f.write_str("hex"),
            DataFormat::Unsigned(width) => write!(f, "u{}", 8 * u32::from(*width)),
            DataFormat::Signed(width) => write!(f, "i{}", 8 * u32::from(*width)),
        }
    }
}

/// A node role filter of `nodelist`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleFilter {
    /// Superpeers only.
    Superpeer,
    /// Peers only.
    Peer,
}

/// One parsed terminal command with typed arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TermCommand {
    /// List the commands, or show one command's usage (answered by the shell itself).
    Help {
        /// The command asked about.
        command: Option<String>,
    },
    /// List the cluster's nodes.
    NodeList {
        /// Only this role.
        role: Option<RoleFilter>,
    },
    /// Show one node's record.
    NodeInfo {
        /// The node.
        node: NodeId,
    },
    /// Shut a node down.
    NodeShutdown {
        /// The node.
        node: NodeId,
        /// Kill at once instead of a clean shutdown.
        kill: bool,
    },
    /// Create chunks on a node.
    ChunkCreate {
        /// Bytes per chunk.
        size: u32,
        /// The peer to create them on.
        node: NodeId,
        /// How many (1..=[`CREATE_COUNT_MAX`]).
        count: u32,
    },
    /// Read a chunk.
    ChunkGet {
        /// The chunk.
        cid: ChunkId,
        /// How to show the data.
        format: DataFormat,
        /// First byte read.
        offset: u32,
        /// Bytes read (to the end if `None`).
        length: Option<u32>,
    },
    /// Write a chunk.
    ChunkPut {
        /// The chunk.
        cid: ChunkId,
        /// The bytes written.
        data: Vec<u8>,
        /// First byte written.
        offset: u32,
    },
    /// Remove a chunk.
    ChunkRemove {
        /// The chunk.
        cid: ChunkId,
    },
    /// List the CID ranges a node stores.
    ChunkList {
        /// The peer.
        node: NodeId,
    },
    /// Show a peer's chunk service status (memory, counts).
    ChunkStatus {
        /// The peer.
        node: NodeId,
    },
    /// Lock a chunk.
    ChunkLock {
        /// The chunk.
        cid: ChunkId,
        /// Write (exclusive) lock; read (shared) otherwise.
        write: bool,
    },
    /// Unlock a chunk.
    ChunkUnlock {
        /// The chunk.
        cid: ChunkId,
    },
    /// Migrate the chunks `first..=last` to a node.
    ChunkMigrate {
        /// First chunk of the range.
        first: ChunkId,
        /// Last chunk of the range (same creator as `first`, not below it).
        last: ChunkId,
        /// The destination peer.
        to: NodeId,
    },
    /// Remove every chunk of `first..=last`.
    ChunkRemoveRange {
        /// First chunk of the range.
        first: ChunkId,
        /// Last chunk of the range (same creator as `first`, not below it).
        last: ChunkId,
    },
    /// Move every chunk a peer holds to other peers (before it is shut down).
    NodeDrain {
        /// The peer to drain.
        node: NodeId,
        /// The peers that take the chunks (empty: every other alive peer).
        targets: Vec<NodeId>,
        /// CIDs per migration request.
        piece: u64,
    },
    /// Wait until the cluster has at least this many alive peers and superpeers.
    NodeWait {
        /// Alive peers waited for.
        peers: u32,
        /// Alive superpeers waited for.
        superpeers: u32,
        /// Longest wait in seconds.
        timeout_secs: u32,
    },
    /// Balancing rounds: move chunks from the busiest peer to the idlest while the
    /// request rates are uneven.
    Balance {
        /// Most rounds.
        rounds: u32,
        /// Milliseconds each round watches the request rates.
        window_ms: u32,
        /// The busiest peer's rate must be this percentage of the mean to act (150: 1.5×).
        imbalance_percent: u32,
        /// Most chunks one round moves.
        max_chunks: u64,
    },
    /// The superpeers' monitoring table (every peer's latest rates), or one peer's
    /// history.
    Monitoring {
        /// One peer's history instead of the table.
        node: Option<NodeId>,
        /// Most history rows.
        history: u32,
    },
    /// Set (or read) a node's log filter.
    LoggerLevel {
        /// The node.
        node: NodeId,
        /// The new filter (`debug`, `info,myriad_node::peer=debug`); `None` reads it.
        filter: Option<String>,
    },
    /// A backup peer's log engine state.
    LogInfo {
        /// The peer.
        node: NodeId,
    },
    /// List the chunk locks held at a peer.
    ChunkLockList {
        /// The peer.
        node: NodeId,
    },
    /// Write a chunk's bytes to a local file.
    ChunkDump {
        /// The chunk.
        cid: ChunkId,
        /// The file written.
        path: String,
    },
    /// Write every chunk a peer holds to a local file (`cid u64 LE, length u32 LE, bytes`
    /// per chunk).
    MemDump {
        /// The peer.
        node: NodeId,
        /// The file written.
        path: String,
    },
    /// Follow the zone recoveries until none is pending, running or waiting.
    RecoveryWait {
        /// Longest wait in seconds.
        timeout_secs: u32,
    },
    /// Register a chunk under a name.
    NameReg {
        /// The chunk.
        cid: ChunkId,
        /// The name.
        name: String,
    },
    /// Look a name up.
    NameGet {
        /// The name.
        name: String,
    },
    /// List every registered name.
    NameList,
    /// Allocate a barrier for a number of peers.
    BarrierAlloc {
        /// Peers that must sign on.
        size: u32,
    },
    /// Sign on to a barrier.
    BarrierSignOn {
        /// The barrier.
        barrier: u32,
        /// Data passed along.
        data: u64,
    },
    /// Show a barrier's status.
    BarrierStatus {
        /// The barrier.
        barrier: u32,
    },
    /// Free a barrier.
    BarrierFree {
        /// The barrier.
        barrier: u32,
    },
    /// Change the number of peers a barrier waits for.
    BarrierSize {
        /// The barrier.
        barrier: u32,
        /// The new number.
        size: u32,
    },
    /// Create an entry in the superpeers' temporary storage.
    TmpCreate {
        /// The entry's ID.
        id: u32,
        /// Its size in bytes.
        size: u32,
    },
    /// Read a temporary storage entry.
    TmpGet {
        /// The entry.
        id: u32,
        /// How to show the data.
        format: DataFormat,
    },
    /// Write a temporary storage entry.
    TmpPut {
        /// The entry.
        id: u32,
        /// The bytes written.
        data: Vec<u8>,
    },
    /// Remove a temporary storage entry.
    TmpRemove {
        /// The entry.
        id: u32,
    },
    /// List the temporary storage entries.
    TmpList,
    /// Show the lookup tree (CID ranges to owners) of a node's chunks.
    LookupTree {
        /// The creator node.
        node: NodeId,
    },
    /// Summarize the superpeers' metadata (of one node, or of all).
    Metadata {
        /// The node, if one.
        node: Option<NodeId>,
    },
    /// Show the superpeer leader's table of zone recoveries.
    Recovery,
    /// Show statistics (of one node, or of this client).
    Stats {
        /// The node, if one.
        node: Option<NodeId>,
    },
    /// Every compute-capable peer's group and role.
    CompGroupList,
    /// A compute group's master status (slaves, queued/running/finished submissions).
    CompGroupStatus {
        /// The group.
        group: u16,
    },
    /// Run one task on a compute group and wait for it.
    CompTask {
        /// The group.
        group: u16,
        /// The registered task name.
        task: String,
        /// Its parameters as JSON text (empty for none).
        params: String,
        /// Fewest slaves.
        slaves_min: u32,
        /// Most slaves (0: all).
        slaves_max: u32,
    },
    /// Graph500 on a compute group: load a Kronecker graph, BFS from random roots,
    /// validate, report MTEPS (`myriad bench graph500` on a running cluster).
    Graph500 {
        /// The group.
        group: u16,
        /// log2 of the vertex count.
        scale: u32,
        /// Slaves that hold the graph (all of the group's when 0).
        slaves: u32,
        /// BFS roots.
        roots: u32,
        /// Edges per vertex.
        edgefactor: u32,
    },
    /// Run a task script file (TOML or JSON) on a compute group and wait for it.
    CompTaskScript {
        /// The group.
        group: u16,
        /// The script file.
        path: String,
    },
    /// Give a peer a role in a compute group.
    CompGroupJoin {
        /// The peer.
        node: NodeId,
        /// The group.
        group: u16,
        /// `master`, `slave` or `none`.
        role: String,
    },
    /// Add a running superpeer (started with `--join`) to the Raft group.
    SuperpeerAdd {
        /// Its node ID.
        node: NodeId,
        /// Where it listens (`IP:PORT`).
        address: String,
    },
    /// Remove a superpeer from the Raft group.
    SuperpeerRemove {
        /// Its node ID.
        node: NodeId,
    },
    /// Start a registered application on a peer.
    CompApp {
        /// The peer.
        node: NodeId,
        /// The application's name.
        name: String,
    },
}

impl TermCommand {
    /// The command's name as typed.
    pub fn name(&self) -> &'static str {
        match self {
            TermCommand::Help { .. } => "help",
            TermCommand::NodeList { .. } => "nodelist",
            TermCommand::NodeInfo { .. } => "nodeinfo",
            TermCommand::NodeShutdown { .. } => "nodeshutdown",
            TermCommand::ChunkCreate { .. } => "chunkcreate",
            TermCommand::ChunkGet { .. } => "chunkget",
            TermCommand::ChunkPut { .. } => "chunkput",
            TermCommand::ChunkRemove { .. } => "chunkremove",
            TermCommand::ChunkList { .. } => "chunklist",
            TermCommand::ChunkStatus { .. } => "chunkstatus",
            TermCommand::ChunkLock { .. } => "chunklock",
            TermCommand::ChunkUnlock { .. } => "chunkunlock",
            TermCommand::ChunkMigrate { .. } => "chunkmigrate",
            TermCommand::ChunkRemoveRange { .. } => "chunkremoverange",
            TermCommand::NodeDrain { .. } => "nodedrain",
            TermCommand::NodeWait { .. } => "nodewait",
            TermCommand::Balance { .. } => "balance",
            TermCommand::Monitoring { .. } => "monitoring",
            TermCommand::LoggerLevel { .. } => "loggerlevel",
            TermCommand::LogInfo { .. } => "loginfo",
            TermCommand::ChunkLockList { .. } => "chunklocklist",
            TermCommand::ChunkDump { .. } => "chunkdump",
            TermCommand::MemDump { .. } => "memdump",
            TermCommand::RecoveryWait { .. } => "recoverywait",
            TermCommand::NameReg { .. } => "namereg",
            TermCommand::NameGet { .. } => "nameget",
            TermCommand::NameList => "namelist",
            TermCommand::BarrierAlloc { .. } => "barrieralloc",
            TermCommand::BarrierSignOn { .. } => "barriersignon",
            TermCommand::BarrierStatus { .. } => "barrierstatus",
            TermCommand::BarrierFree { .. } => "barrierfree",
            TermCommand::BarrierSize { .. } => "barriersize",
            TermCommand::TmpCreate { .. } => "tmpcreate",
            TermCommand::TmpGet { .. } => "tmpget",
            TermCommand::TmpPut { .. } => "tmpput",
            TermCommand::TmpRemove { .. } => "tmpremove",
            TermCommand::TmpList => "tmplist",
            TermCommand::LookupTree { .. } => "lookuptree",
            TermCommand::Metadata { .. } => "metadata",
            TermCommand::Recovery => "recovery",
            TermCommand::Stats { .. } => "stats",
            TermCommand::SuperpeerAdd { .. } => "superpeeradd",
            TermCommand::SuperpeerRemove { .. } => "superpeerremove",
            TermCommand::CompGroupList => "compgrpls",
            TermCommand::CompGroupStatus { .. } => "compgrpstatus",
            TermCommand::CompTask { .. } => "comptask",
            TermCommand::CompTaskScript { .. } => "comptaskscript",
            TermCommand::Graph500 { .. } => "graph500",
            TermCommand::CompGroupJoin { .. } => "compgrpjoin",
            TermCommand::CompApp { .. } => "compapp",
        }
    }
}

/// Name, usage and one-line summary of a command.
#[derive(Debug, Clone, Copy)]
pub struct CommandSpec {
    /// The name.
    pub name: &'static str,
    /// Its usage line.
    pub usage: &'static str,
    /// What it does.
    pub summary: &'static str,
}

/// Every command, in the order `help` lists them.
pub const COMMANDS: &[CommandSpec] = &[
    spec(
        "help",
        "help [command]",
        "list the commands or show one's usage",
    ),
    spec(
        "nodelist",
        "nodelist [superpeer|peer]",
        "list the cluster's nodes",
    ),
    spec("nodeinfo", "nodeinfo <nid>", "show one node"),
    spec(
        "nodeshutdown",
        "nodeshutdown <nid> [--kill]",
        "shut a node down (a superpeer leaves the Raft group first)",
    ),
    spec(
        "chunkcreate",
        "chunkcreate <size> <nid> [count]",
        "create chunks on a peer",
    ),
    spec(
        "chunkget",
        "chunkget <cid> [str|hex|u8..u64|i8..i64] [--offset N] [--length N]",
        "read a chunk",
    ),
    spec(
        "chunkput",
        "chunkput <cid> <data> [str|hex|u8..u64|i8..i64] [--offset N]",
        "write a chunk",
    ),
    spec("chunkremove", "chunkremove <cid>", "remove a chunk"),
    spec(
        "chunklist",
        "chunklist <nid>",
        "list the CID ranges a peer stores",
    ),
    spec(
        "chunkstatus",
        "chunkstatus <nid>",
        "show a peer's chunk service status",
    ),
    spec(
        "chunklock",
        "chunklock <cid> [write|read]",
        "lock a chunk (write by default)",
    ),
    spec("chunkunlock", "chunkunlock <cid>", "unlock a chunk"),
    spec(
        "chunkmigrate",
        "chunkmigrate <cid> [last-cid] <to-nid>",
        "migrate a chunk or a CID range to a peer",
    ),
    spec(
        "chunkremoverange",
        "chunkremoverange <first-cid> <last-cid>",
        "remove every chunk of a CID range",
    ),
    spec(
        "nodedrain",
        "nodedrain <nid> [--to nid,nid,..] [--piece N]",
        "move every chunk of a peer to other peers (before nodeshutdown)",
    ),
    spec(
        "nodewait",
        "nodewait [--peers N] [--superpeers N] [--timeout SECS]",
        "wait until this many peers and superpeers are alive",
    ),
    spec(
        "balance",
        "balance [--rounds N] [--window-ms MS] [--imbalance X] [--max-chunks N]",
        "move chunks from the busiest peer to the idlest while rates are uneven",
    ),
    spec(
        "monitoring",
        "monitoring [nid] [--history N]",
        "the peers' CPU, memory, network, disk and request rates (or one peer's history)",
    ),
    spec(
        "loggerlevel",
        "loggerlevel <nid> [filter]",
        "set or show a node's log filter (a level, or per module: info,myriad_node=debug)",
    ),
    spec(
        "loginfo",
        "loginfo <nid>",
        "show a backup peer's log engine state",
    ),
    spec(
        "chunklocklist",
        "chunklocklist <nid>",
        "list the chunk locks held at a peer",
    ),
    spec(
        "chunkdump",
        "chunkdump <cid> <file>",
        "write a chunk's bytes to a local file",
    ),
    spec(
        "memdump",
        "memdump <nid> <file>",
        "write every chunk of a peer to a local file (cid, length, bytes per chunk)",
    ),
    spec(
        "recoverywait",
        "recoverywait [--timeout SECS]",
        "follow the zone recoveries (a progress bar) until none is left to do",
    ),
    spec(
        "namereg",
        "namereg <cid> <name>",
        "register a chunk under a name",
    ),
    spec("nameget", "nameget <name>", "look a name up"),
    spec("namelist", "namelist", "list every registered name"),
    spec(
        "barrieralloc",
        "barrieralloc <peers>",
        "allocate a barrier for n peers",
    ),
    spec(
        "barriersignon",
        "barriersignon <bid> [data]",
        "sign on to a barrier",
    ),
    spec(
        "barrierstatus",
        "barrierstatus <bid>",
        "show a barrier's status",
    ),
    spec("barrierfree", "barrierfree <bid>", "free a barrier"),
    spec(
        "barriersize",
        "barriersize <bid> <peers>",
        "change a barrier's size",
    ),
    spec(
        "tmpcreate",
        "tmpcreate <id> <size>",
        "create a temporary storage entry",
    ),
    spec(
        "tmpget",
        "tmpget <id> [str|hex|u8..u64|i8..i64]",
        "read a temporary entry",
    ),
    spec(
        "tmpput",
        "tmpput <id> <data> [str|hex|u8..u64|i8..i64]",
        "write a temporary entry",
    ),
    spec("tmpremove", "tmpremove <id>", "remove a temporary entry"),
    spec("tmplist", "tmplist", "list the temporary entries"),
    spec(
        "lookuptree",
        "lookuptree <nid>",
        "show the lookup tree of a creator's chunks",
    ),
    spec(
        "metadata",
        "metadata [nid]",
        "summarize the superpeers' metadata",
    ),
    spec(
        "recovery",
        "recovery",
        "show the recoveries of failed peers' zones",
    ),
    spec("stats", "stats [nid]", "show statistics"),
    spec(
        "superpeeradd",
        "superpeeradd <nid> <ip:port>",
        "add a running superpeer (started with --join) to the Raft group",
    ),
    spec(
        "superpeerremove",
        "superpeerremove <nid>",
        "remove a superpeer from the Raft group",
    ),
    spec(
        "compgrpls",
        "compgrpls",
        "list the compute groups and every peer's role",
    ),
    spec(
        "compgrpstatus",
        "compgrpstatus <group>",
        "show a compute group's slaves and submissions",
    ),
    spec(
        "comptask",
        "comptask <group> <task> [params-json] [--slaves-min N] [--slaves-max N]",
        "run a task on a compute group's slaves",
    ),
    spec(
        "comptaskscript",
        "comptaskscript <group> <file>",
        "run a task script (TOML or JSON) on a compute group",
    ),
    spec(
        "graph500",
        "graph500 <group> <scale> [--slaves N] [--roots N] [--edgefactor N]",
        "load a Graph500 graph on a group's slaves, run and validate BFS, report MTEPS",
    ),
    spec(
        "compgrpjoin",
        "compgrpjoin <nid> <group> <master|slave|none>",
        "give a peer a role in a compute group",
    ),
    spec(
        "compapp",
        "compapp <nid> <name>",
        "start a registered application on a peer",
    ),
];

const fn spec(name: &'static str, usage: &'static str, summary: &'static str) -> CommandSpec {
    CommandSpec {
        name,
        usage,
        summary,
    }
}

/// The spec of a command by name.
pub fn command_spec(name: &str) -> Option<&'static CommandSpec> {
    COMMANDS.iter().find(|spec| spec.name == name)
}

/// Why a line could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The command concerned, if the error is within one.
    pub command: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl ParseError {
    fn line(message: impl Into<String>) -> Self {
        ParseError {
            command: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.command {
            Some(name) => {
                write!(f, "{name}: {}", self.message)?;
                if let Some(spec) = command_spec(name) {
                    write!(f, " (usage: {})", spec.usage)?;
                }
                Ok(())
            }
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ParseError {}

/// A word of input.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    text: String,
    /// Quoted words are never options or separators.
    quoted: bool,
}

/// Splits a line into commands of tokens (`;` separates commands).
fn tokenize(line: &str) -> Result<Vec<Vec<Token>>, ParseError> {
    if line.len() > LINE_BYTES_MAX {
        return Err(ParseError::line(format!(
            "line longer than {LINE_BYTES_MAX} bytes"
        )));
    }
    let mut commands = vec![Vec::new()];
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        if c == ';' {
            chars.next();
            commands.push(Vec::new());
            if commands.len() > COMMANDS_PER_LINE_MAX {
                return Err(ParseError::line(format!(
                    "more than {COMMANDS_PER_LINE_MAX} commands on one line"
                )));
            }
            continue;
        }
        let mut text = String::new();
        let mut quoted = false;
        while let Some(&c) = chars.peek() {
            if c.is_whitespace() || c == ';' {
                break;
            }
            chars.next();
            match c {
                '\'' => {
                    quoted = true;
                    loop {
                        match chars.next() {
                            Some('\'') => break,
                            Some(c) => text.push(c),
                            None => return Err(ParseError::line("unterminated ' quote")),
                        }
                    }
                }
                '"' => {
                    quoted = true;
                    loop {
                        match chars.next() {
                            Some('"') => break,
                            Some('\\') => text.push(unescape(&mut chars)?),
                            Some(c) => text.push(c),
                            None => return Err(ParseError::line("unterminated \" quote")),
                        }
                    }
                }
                c => text.push(c),
            }
        }
        if let Some(command) = commands.last_mut() {
            command.push(Token { text, quoted });
        }
    }
    Ok(commands.into_iter().filter(|c| !c.is_empty()).collect())
}

fn unescape(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Result<char, ParseError> {
    match chars.next() {
        Some('n') => Ok('\n'),
        Some('t') => Ok('\t'),
        Some('0') => Ok('\0'),
        Some('x') => {
            let high = chars.next().and_then(|c| c.to_digit(16));
            let low = chars.next().and_then(|c| c.to_digit(16));
            match (high, low) {
                // Two hex digits make at most 0xff, always a valid char.
                (Some(high), Some(low)) => char::from_u32(high * 16 + low)
                    .ok_or_else(|| ParseError::line("bad \\x escape")),
                _ => Err(ParseError::line("\\x needs two hex digits")),
            }
        }
        Some(c @ ('"' | '\\' | '\'')) => Ok(c),
        Some(c) => Err(ParseError::line(format!("unknown escape \\{c}"))),
        None => Err(ParseError::line("unterminated \" quote")),
    }
}

/// Parses a line of `;`-separated commands; empty commands are skipped.
pub fn parse_line(line: &str) -> Result<Vec<TermCommand>, ParseError> {
    tokenize(line)?
        .iter()
        .map(|tokens| parse_tokens(tokens))
        .collect()
}

// Called by tests only.
#[allow(dead_code)]
/// Parses one command (a line without `;`, or the first of several is an error).
pub fn parse_command(line: &str) -> Result<TermCommand, ParseError> {
    let mut commands = parse_line(line)?;
    match commands.len() {
        1 => Ok(commands.remove(0)),
        0 => Err(ParseError::line("empty command")),
        _ => Err(ParseError::line("expected one command, found several")),
    }
}

/// The arguments of one command: positional words and `--options`.
struct Args<'a> {
    name: &'static str,
    positional: Vec<&'a str>,
    options: Vec<(&'a str, Option<&'a str>)>,
}

impl<'a> Args<'a> {
    /// Splits `tokens` (after the name); `valued` lists options that take a value.
    fn split(
        name: &'static str,
        tokens: &'a [Token],
        flags: &[&str],
        valued: &[&str],
    ) -> Result<Self, ParseError> {
        let mut args = Args {
            name,
            positional: Vec::new(),
            options: Vec::new(),
        };
        let mut index = 0;
        while let Some(token) = tokens.get(index) {
            index += 1;
            let option = if token.quoted {
                None
            } else {
                token.text.strip_prefix("--").filter(|o| !o.is_empty())
            };
            match option {
                Some(option) if valued.contains(&option) => {
                    let value = tokens
                        .get(index)
                        .ok_or_else(|| args.error(format!("--{option} needs a value")))?;
                    index += 1;
                    args.options.push((option, Some(value.text.as_str())));
                }
                Some(option) if flags.contains(&option) => args.options.push((option, None)),
                Some(option) => return Err(args.error(format!("unknown option --{option}"))),
                None => args.positional.push(token.text.as_str()),
            }
        }
        Ok(args)
    }

    fn error(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            command: Some(self.name.to_string()),
            message: message.into(),
        }
    }

    /// Checks the number of positional arguments.
    fn count(&self, min: usize, max: usize) -> Result<(), ParseError> {
        let n = self.positional.len();
        if n < min {
            Err(self.error(format!(
                "missing argument (expected {min}{})",
                if max > min {
                    format!(" to {max}")
                } else {
                    String::new()
                }
            )))
        } else if n > max {
            Err(self.error(format!(
                "too many arguments ({n}, at most {max}): {:?}",
                self.positional[max]
            )))
        } else {
            Ok(())
        }
    }

    fn get(&self, index: usize) -> Option<&'a str> {
        self.positional.get(index).copied()
    }

    fn flag(&self, option: &str) -> bool {
        self.options.iter().any(|(name, _)| *name == option)
    }

    fn option(&self, option: &str) -> Option<&'a str> {
        self.options
            .iter()
            .rev()
            .find(|(name, _)| *name == option)
            .and_then(|(_, value)| *value)
    }

    fn cid(&self, index: usize) -> Result<ChunkId, ParseError> {
        let text = self.required(index)?;
        text.parse::<ChunkId>().map_err(|_| {
            self.error(format!(
                "invalid chunk ID {text:?} (0x<16 hex>, <decimal> or <creator>:<local id>)"
            ))
        })
    }

    fn node(&self, index: usize) -> Result<NodeId, ParseError> {
        let text = self.required(index)?;
        parse_u64(text)
            .and_then(|n| u16::try_from(n).ok())
            .map(NodeId)
            .ok_or_else(|| {
                self.error(format!(
                    "invalid node ID {text:?} (decimal or 0x hex, 16 bits)"
                ))
            })
    }

    fn optional_node(&self, index: usize) -> Result<Option<NodeId>, ParseError> {
        match self.get(index) {
            Some(_) => self.node(index).map(Some),
            None => Ok(None),
        }
    }

    fn number_u32(&self, index: usize, what: &str) -> Result<u32, ParseError> {
        let text = self.required(index)?;
        parse_u64(text)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.error(format!("invalid {what} {text:?} (a 32-bit number)")))
    }

    fn option_u32(&self, option: &str) -> Result<Option<u32>, ParseError> {
        match self.option(option) {
            Some(text) => parse_u64(text)
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.error(format!("invalid --{option} {text:?}"))),
            None => Ok(None),
        }
    }

    fn format(&self, index: usize) -> Result<DataFormat, ParseError> {
        match self.get(index) {
            Some(word) => DataFormat::parse(word).ok_or_else(|| {
                self.error(format!(
                    "unknown format {word:?} (str, hex, u8, u16, u32, u64, i8, i16, i32, i64)"
                ))
            }),
            None => Ok(DataFormat::Str),
        }
    }

    fn data(&self, index: usize, format_index: usize) -> Result<Vec<u8>, ParseError> {
        let text = self.required(index)?;
        let format = self.format(format_index)?;
        let data = format
            .encode(text)
            .map_err(|message| self.error(format!("bad {format} data: {message}")))?;
        if data.len() > CHUNK_BYTES_MAX as usize {
            return Err(self.error(format!("data longer than {CHUNK_BYTES_MAX} bytes")));
        }
        Ok(data)
    }

    fn required(&self, index: usize) -> Result<&'a str, ParseError> {
        self.get(index)
            .ok_or_else(|| self.error("missing argument"))
    }
}

fn parse_tokens(tokens: &[Token]) -> Result<TermCommand, ParseError> {
    let Some((first, rest)) = tokens.split_first() else {
        return Err(ParseError::line("empty command"));
    };
    let lowered = first.text.to_ascii_lowercase();
    let Some(spec) = command_spec(&lowered) else {
        return Err(ParseError::line(format!(
            "unknown command {:?} (try help)",
            first.text
        )));
    };
    let name = spec.name;
    let (flags, valued): (&[&str], &[&str]) = match name {
        "nodeshutdown" => (&["kill"], &[]),
        "chunkget" => (&[], &["offset", "length"]),
        "chunkput" => (&[], &["offset"]),
        "comptask" => (&[], &["slaves-min", "slaves-max"]),
        "nodedrain" => (&[], &["to", "piece"]),
        "nodewait" => (&[], &["peers", "superpeers", "timeout"]),
        "balance" => (&[], &["rounds", "window-ms", "imbalance", "max-chunks"]),
        "monitoring" => (&[], &["history"]),
        "recoverywait" => (&[], &["timeout"]),
        "graph500" => (&[], &["slaves", "roots", "edgefactor"]),
        _ => (&[], &[]),
    };
    let a = Args::split(name, rest, flags, valued)?;
    match name {
        "help" | "nodelist" | "nodeinfo" | "nodeshutdown" => parse_node(&a, name),
        "chunkcreate" | "chunkget" | "chunkput" | "chunkremove" | "chunklist" | "chunkstatus"
        | "chunklock" | "chunkunlock" | "chunkmigrate" => parse_chunk(&a, name),
        "namereg" | "nameget" | "namelist" => parse_name(&a, name),
        "barrieralloc" | "barriersignon" | "barrierstatus" | "barrierfree" | "barriersize" => {
            parse_barrier(&a, name)
        }
        "tmpcreate" | "tmpget" | "tmpput" | "tmpremove" | "tmplist" => parse_tmp(&a, name),
        "lookuptree" | "metadata" | "recovery" | "stats" | "superpeeradd" | "superpeerremove" => {
            parse_cluster(&a, name)
        }
        "compgrpls" | "compgrpstatus" | "comptask" | "comptaskscript" | "compgrpjoin"
        | "compapp" | "graph500" => compute::parse(&a, name),
        "chunkremoverange" | "nodedrain" | "nodewait" | "balance" | "monitoring"
        | "loggerlevel" | "loginfo" | "chunklocklist" | "chunkdump" | "memdump"
        | "recoverywait" => ops::parse(&a, name),
        other => Err(no_parser(other)),
    }
}

/// The error for a command in the table that no parser handles.
fn no_parser(name: &str) -> ParseError {
    ParseError::line(format!("command {name:?} has no parser"))
}

/// The node commands and `help`.
fn parse_node(a: &Args<'_>, name: &str) -> Result<TermCommand, ParseError> {
    let command = match name {
        "help" => {
            a.count(0, 1)?;
            TermCommand::Help {
                command: a.get(0).map(str::to_ascii_lowercase),
            }
        }
        "nodelist" => {
            a.count(0, 1)?;
            let role = match a.get(0).map(str::to_ascii_lowercase).as_deref() {
                None | Some("all") => None,
                Some("superpeer" | "superpeers") => Some(RoleFilter::Superpeer),
                Some("peer" | "peers") => Some(RoleFilter::Peer),
                Some(other) => {
                    return Err(a.error(format!("unknown role {other:?} (superpeer, peer)")))
                }
            };
            TermCommand::NodeList { role }
        }
        "nodeinfo" => {
            a.count(1, 1)?;
            TermCommand::NodeInfo { node: a.node(0)? }
        }
        "nodeshutdown" => {
            a.count(1, 1)?;
            TermCommand::NodeShutdown {
                node: a.node(0)?,
                kill: a.flag("kill"),
            }
        }
        other => return Err(no_parser(other)),
    };
    Ok(command)
}

/// The chunk commands (`chunk*`).
fn parse_chunk(a: &Args<'_>, name: &str) -> Result<TermCommand, ParseError> {
    let command = match name {
        "chunkcreate" => {
            a.count(2, 3)?;
            let size = a.number_u32(0, "size")?;
            if size == 0 || size > CHUNK_BYTES_MAX {
                return Err(a.error(format!("size must be 1..={CHUNK_BYTES_MAX}")));
            }
            let count = match a.get(2) {
                Some(_) => a.number_u32(2, "count")?,
                None => 1,
            };
            if count == 0 || count > CREATE_COUNT_MAX {
                return Err(a.error(format!("count must be 1..={CREATE_COUNT_MAX}")));
            }
            TermCommand::ChunkCreate {
                size,
                node: a.node(1)?,
                count,
            }
        }
        "chunkget" => {
            a.count(1, 2)?;
            TermCommand::ChunkGet {
                cid: a.cid(0)?,
                format: a.format(1)?,
                offset: a.option_u32("offset")?.unwrap_or(0),
                length: a.option_u32("length")?,
            }
        }
        "chunkput" => {
            a.count(2, 3)?;
            TermCommand::ChunkPut {
                cid: a.cid(0)?,
                data: a.data(1, 2)?,
                offset: a.option_u32("offset")?.unwrap_or(0),
            }
        }
        "chunkremove" => {
            a.count(1, 1)?;
            TermCommand::ChunkRemove { cid: a.cid(0)? }
        }
        "chunklist" => {
            a.count(1, 1)?;
            TermCommand::ChunkList { node: a.node(0)? }
        }
        "chunkstatus" => {
            a.count(1, 1)?;
            TermCommand::ChunkStatus { node: a.node(0)? }
        }
        "chunklock" => {
            a.count(1, 2)?;
            let write = match a.get(1).map(str::to_ascii_lowercase).as_deref() {
                None | Some("write") => true,
                Some("read") => false,
                Some(other) => {
                    return Err(a.error(format!("lock mode {other:?} is not read or write")))
                }
            };
            TermCommand::ChunkLock {
                cid: a.cid(0)?,
                write,
            }
        }
        "chunkunlock" => {
            a.count(1, 1)?;
            TermCommand::ChunkUnlock { cid: a.cid(0)? }
        }
        "chunkmigrate" => {
            a.count(2, 3)?;
            let first = a.cid(0)?;
            let (last, to) = if a.positional.len() == 3 {
                (a.cid(1)?, a.node(2)?)
            } else {
                (first, a.node(1)?)
            };
            if last.creator() != first.creator() || last < first {
                return Err(a.error(format!(
                    "range {first}..{last} must lie within one creator, first <= last"
                )));
            }
            TermCommand::ChunkMigrate { first, last, to }
        }
        other => return Err(no_parser(other)),
    };
    Ok(command)
}

/// The nameservice commands (`name*`).
fn parse_name(a: &Args<'_>, name: &str) -> Result<TermCommand, ParseError> {
    let command = match name {
        "namereg" => {
            a.count(2, 2)?;
            TermCommand::NameReg {
                cid: a.cid(0)?,
                name: name_arg(a, 1)?,
            }
        }
        "nameget" => {
            a.count(1, 1)?;
            TermCommand::NameGet {
                name: name_arg(a, 0)?,
            }
        }
        "namelist" => {
            a.count(0, 0)?;
            TermCommand::NameList
        }
        other => return Err(no_parser(other)),
    };
    Ok(command)
}

/// The barrier commands (`barrier*`).
fn parse_barrier(a: &Args<'_>, name: &str) -> Result<TermCommand, ParseError> {
    let command = match name {
        "barrieralloc" => {
            a.count(1, 1)?;
            let size = a.number_u32(0, "peer count")?;
            if size == 0 {
                return Err(a.error("a barrier needs at least one peer"));
            }
            TermCommand::BarrierAlloc { size }
        }
        "barriersignon" => {
            a.count(1, 2)?;
            let data = match a.get(1) {
                Some(text) => {
                    parse_u64(text).ok_or_else(|| a.error(format!("invalid data {text:?}")))?
                }
                None => 0,
            };
            TermCommand::BarrierSignOn {
                barrier: a.number_u32(0, "barrier ID")?,
                data,
            }
        }
        "barrierstatus" => {
            a.count(1, 1)?;
            TermCommand::BarrierStatus {
                barrier: a.number_u32(0, "barrier ID")?,
            }
        }
        "barrierfree" => {
            a.count(1, 1)?;
            TermCommand::BarrierFree {
                barrier: a.number_u32(0, "barrier ID")?,
            }
        }
        "barriersize" => {
            a.count(2, 2)?;
            let size = a.number_u32(1, "peer count")?;
            if size == 0 {
                return Err(a.error("a barrier needs at least one peer"));
            }
            TermCommand::BarrierSize {
                barrier: a.number_u32(0, "barrier ID")?,
                size,
            }
        }
        other => return Err(no_parser(other)),
    };
    Ok(command)
}

/// The temporary storage commands (`tmp*`).
fn parse_tmp(a: &Args<'_>, name: &str) -> Result<TermCommand, ParseError> {
    let command = match name {
        "tmpcreate" => {
            a.count(2, 2)?;
            let size = a.number_u32(1, "size")?;
            if size == 0 || size > CHUNK_BYTES_MAX {
                return Err(a.error(format!("size must be 1..={CHUNK_BYTES_MAX}")));
            }
            TermCommand::TmpCreate {
                id: a.number_u32(0, "ID")?,
                size,
            }
        }
        "tmpget" => {
            a.count(1, 2)?;
            TermCommand::TmpGet {
                id: a.number_u32(0, "ID")?,
                format: a.format(1)?,
            }
        }
        "tmpput" => {
            a.count(2, 3)?;
            TermCommand::TmpPut {
                id: a.number_u32(0, "ID")?,
                data: a.data(1, 2)?,
            }
        }
        "tmpremove" => {
            a.count(1, 1)?;
            TermCommand::TmpRemove {
                id: a.number_u32(0, "ID")?,
            }
        }
        "tmplist" => {
            a.count(0, 0)?;
            TermCommand::TmpList
        }
        other => return Err(no_parser(other)),
    };
    Ok(command)
}

/// The cluster-wide views: `lookuptree`, `metadata`, `recovery`, `stats`.
fn parse_cluster(a: &Args<'_>, name: &str) -> Result<TermCommand, ParseError> {
    let command = match name {
        "lookuptree" => {
            a.count(1, 1)?;
            TermCommand::LookupTree { node: a.node(0)? }
        }
        "metadata" => {
            a.count(0, 1)?;
            TermCommand::Metadata {
                node: a.optional_node(0)?,
            }
        }
        "recovery" => {
            a.count(0, 0)?;
            TermCommand::Recovery
        }
        "stats" => {
            a.count(0, 1)?;
            TermCommand::Stats {
                node: a.optional_node(0)?,
            }
        }
        "superpeeradd" => {
            a.count(2, 2)?;
            let address = a.required(1)?;
            if address.parse::<std::net::SocketAddr>().is_err() {
                return Err(a.error(format!("invalid address {address:?} (IP:PORT)")));
            }
            TermCommand::SuperpeerAdd {
                node: a.node(0)?,
                address: address.to_owned(),
            }
        }
        "superpeerremove" => {
            a.count(1, 1)?;
            TermCommand::SuperpeerRemove { node: a.node(0)? }
        }
        other => return Err(no_parser(other)),
    };
    Ok(command)
}

fn name_arg(a: &Args<'_>, index: usize) -> Result<String, ParseError> {
    let name = a.required(index)?;
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(a.error(format!("a name has 1..={NAME_BYTES_MAX} bytes")));
    }
    Ok(name.to_string())
}

/// Parses a decimal or `0x` hex number (`_` separators allowed).
pub fn parse_u64(text: &str) -> Option<u64> {
    let text = text.trim().replace('_', "");
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// Parses hex bytes (`0a0b`, optional `0x`).
fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    if !digits.len().is_multiple_of(2) {
        return Err("odd number of hex digits".into());
    }
    digits
        .as_bytes()
        .chunks(2)
        .map(|pair| {
            let digit = |b: u8| (b as char).to_digit(16);
            match (digit(pair[0]), pair.get(1).copied().and_then(digit)) {
                (Some(high), Some(low)) => Ok((high * 16 + low) as u8),
                _ => Err(format!("not hex: {:?}", String::from_utf8_lossy(pair))),
            }
        })
        .collect()
}
